"""OpenAI chat <-> Anthropic Messages, as data: a chat request becomes a Messages
request, and a Messages answer becomes a chat completion whose usage the rest of the
gateway books (prompt = input + cache reads + cache writes, cached = cache reads,
cache_write = cache writes; stop reasons mapped both ways)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

STOP_TO_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                  "pause_turn": "stop", "refusal": "content_filter"}
FINISH_TO_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
DEFAULT_MAX_TOKENS = 4096


def usage_to_openai(usage: Mapping[str, Any]) -> dict[str, Any]:
    """Anthropic's usage (input excludes cache reads and writes) in OpenAI's shape."""
    uncached = int(usage.get("input_tokens") or 0)
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    output = int(usage.get("output_tokens") or 0)
    prompt = uncached + read + written
    details = {"cached_tokens": read, "cache_write_tokens": written}
    split = usage.get("cache_creation")
    if isinstance(split, Mapping) and split.get("ephemeral_1h_input_tokens"):
        details["cache_write_1h_tokens"] = int(split["ephemeral_1h_input_tokens"])  # billed at the 1-hour rate
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output,
            "prompt_tokens_details": details}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


def _user_blocks(content: Any) -> list[dict[str, Any]] | str:
    if not isinstance(content, list):
        return str(content or "")
    blocks: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text":
            blocks.append(_text_block(part))
        elif part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url", ""))
            if url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                blocks.append({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}})
            else:
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
    return blocks


def _text_block(part: Mapping[str, Any]) -> dict[str, Any]:
    """A text part as a text block, with the `cache_control` breakpoint it carries."""
    block: dict[str, Any] = {"type": "text", "text": str(part.get("text", ""))}
    if isinstance(part.get("cache_control"), Mapping):
        block["cache_control"] = dict(part["cache_control"])
    return block


def _system_blocks(content: Any) -> list[dict[str, Any]]:
    """A system message as text blocks: one, or one per part when a part marks a cache
    breakpoint (which only a list of blocks can carry)."""
    if isinstance(content, list) and any(isinstance(p, Mapping) and "cache_control" in p for p in content):
        return [_text_block(p) for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
    return [{"type": "text", "text": _text(content)}]


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]] | str) -> None:
    """Anthropic wants alternating roles: consecutive turns of one role are merged."""
    as_list = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else blocks
    if messages and messages[-1]["role"] == role:
        previous = messages[-1]["content"]
        messages[-1]["content"] = ([{"type": "text", "text": previous}] if isinstance(previous, str) else previous) + as_list
    else:
        messages.append({"role": role, "content": blocks})


def chat_to_messages(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A chat completions request as a Messages request for `model`."""
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for message in body.get("messages") or []:
        role = message.get("role")
        if role in ("system", "developer"):
            system.extend(_system_blocks(message.get("content")))
        elif role == "user":
            _append(messages, "user", _user_blocks(message.get("content")))
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if text := _text(message.get("content")):
                blocks.append({"type": "text", "text": text})
            for call in message.get("tool_calls") or []:
                fn = call.get("function") or {}
                try:
                    arguments = orjson.loads(fn.get("arguments") or "{}")
                except orjson.JSONDecodeError:
                    arguments = {}
                blocks.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": arguments})
            _append(messages, "assistant", blocks)
        elif role == "tool":
            result = {"type": "tool_result", "tool_use_id": message.get("tool_call_id"), "content": _text(message.get("content"))}
            _append(messages, "user", [result])
    out: dict[str, Any] = {"model": model, "messages": messages,
                           "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS}
    if system:  # a string unless a block carries a breakpoint
        marked = any("cache_control" in b for b in system)
        out["system"] = system if marked else "\n\n".join(b["text"] for b in system)
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    for name in ("temperature", "top_p", "stream"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("user") or body.get("safety_identifier"):
        out["metadata"] = {"user_id": str(body.get("safety_identifier") or body.get("user"))}
    tools = [t.get("function") or {} for t in body.get("tools") or [] if isinstance(t, Mapping)]
    if tools:
        out["tools"] = [{"name": f.get("name"), "description": f.get("description", ""),
                         "input_schema": f.get("parameters") or {"type": "object"}} for f in tools]
        choice = body.get("tool_choice")
        if choice == "required":
            out["tool_choice"] = {"type": "any"}
        elif choice == "none":
            out["tool_choice"] = {"type": "none"}
        elif isinstance(choice, Mapping):
            out["tool_choice"] = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    return out


def message_to_chat(message: Mapping[str, Any], created: int) -> dict[str, Any]:
    """A Messages answer as a chat completion."""
    text = "".join(str(b.get("text", "")) for b in message.get("content") or [] if b.get("type") == "text")
    calls = [
        {"id": b.get("id"), "type": "function",
         "function": {"name": b.get("name"), "arguments": orjson.dumps(b.get("input") or {}).decode()}}
        for b in message.get("content") or [] if b.get("type") == "tool_use"
    ]
    reply: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": "chatcmpl-" + str(message.get("id", "")).removeprefix("msg_"), "object": "chat.completion",
        "created": created, "model": message.get("model"),
        "choices": [{"index": 0, "message": reply, "logprobs": None,
                     "finish_reason": STOP_TO_FINISH.get(str(message.get("stop_reason")), "stop")}],
        "usage": usage_to_openai(message.get("usage") or {}),
    }


def error_to_openai(status: int, raw: bytes) -> bytes:
    """Anthropic's error body in OpenAI's shape, so the gateway's error path reads it."""
    try:
        body = orjson.loads(raw)
        error = body.get("error") if isinstance(body, dict) else None
    except orjson.JSONDecodeError:
        error = None
    if not isinstance(error, dict):
        return raw
    return orjson.dumps({"error": {"message": str(error.get("message", "")), "type": str(error.get("type", "api_error")),
                                   "param": None, "code": None}})
