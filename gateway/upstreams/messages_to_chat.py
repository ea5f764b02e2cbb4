"""Anthropic Messages -> OpenAI chat, as data: a Messages request becomes a chat
completions request for a model on an OpenAI-kind or vLLM upstream, and that model's
chat completion comes back as a Messages answer. The reverse direction (a chat request
to an Anthropic upstream) is upstreams/anthropic_translate.py.

Usage maps back as Anthropic counts it: `input_tokens` excludes cache reads and writes,
`cache_read_input_tokens` = cached, `cache_creation_input_tokens` = cache writes;
finish reasons map stop -> end_turn, length -> max_tokens, tool_calls -> tool_use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.upstreams.anthropic_translate import FINISH_TO_STOP

# Sampling fields both dialects name alike; the rest are mapped below or have no
# chat equivalent (`top_k`, `thinking`, `cache_control`) and are left out.
SAME_NAMED = ("temperature", "top_p", "stream")
TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def usage_to_anthropic(usage: Mapping[str, Any] | None) -> dict[str, int]:
    """OpenAI's usage (prompt includes cached and cache-write tokens) in Anthropic's shape."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    read = int(details.get("cached_tokens") or 0)
    written = int(details.get("cache_write_tokens") or 0)
    prompt = int(usage.get("prompt_tokens") or 0)
    return {"input_tokens": max(prompt - read - written, 0), "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read, "output_tokens": int(usage.get("completion_tokens") or 0)}


def stop_reason(finish_reason: Any) -> str:
    return FINISH_TO_STOP.get(str(finish_reason), "end_turn")


def _blocks(content: Any) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, Mapping)]


def _text(content: Any) -> str:
    return "".join(str(b.get("text", "")) for b in _blocks(content) if b.get("type") == "text")


def _image_url(source: Mapping[str, Any]) -> str:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    return str(source.get("url", ""))


def _user_parts(blocks: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if block.get("type") == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif block.get("type") == "image" and isinstance(block.get("source"), Mapping):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
    return parts


def _user_turn(content: Any) -> list[dict[str, Any]]:
    """One user turn: its tool results first, each a `tool` message (chat wants them
    right after the assistant's calls), then what the user wrote, if anything."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    blocks = _blocks(content)
    turn: list[dict[str, Any]] = []
    for block in blocks:
        if block.get("type") == "tool_result":
            result = _text(block.get("content")) if not isinstance(block.get("content"), str) else block["content"]
            if block.get("is_error"):
                result = f"Error: {result}"
            turn.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": result})
    parts = _user_parts(blocks)
    if parts:
        plain = all(p["type"] == "text" for p in parts)
        turn.append({"role": "user", "content": "".join(p["text"] for p in parts) if plain else parts})
    return turn


def _assistant_turn(content: Any) -> dict[str, Any]:
    blocks = _blocks(content)
    turn: dict[str, Any] = {"role": "assistant", "content": _text(blocks) or None}
    calls = [{"id": str(b.get("id", "")), "type": "function",
              "function": {"name": str(b.get("name", "")), "arguments": orjson.dumps(b.get("input") or {}).decode()}}
             for b in blocks if b.get("type") == "tool_use"]
    if calls:
        turn["tool_calls"] = calls
    return turn


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") not in (None, "custom"):
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise InvalidRequest(f"tools.{i}: Anthropic's own tool `{kind}` runs only on a `kind: anthropic` upstream",
                                 param=f"tools.{i}")
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Mapping[str, Any], out: dict[str, Any]) -> None:
    kind = choice.get("type")
    if kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif kind in TOOL_CHOICE:
        out["tool_choice"] = TOOL_CHOICE[str(kind)]
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False


def request_to_chat(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A Messages request as a chat completions request for `model`."""
    chat: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        chat.append({"role": "system", "content": system if isinstance(system, str) else
                     "\n\n".join(str(b.get("text", "")) for b in _blocks(system) if b.get("type") == "text")})
    for message in body.get("messages") or []:
        if message.get("role") == "assistant":
            chat.append(_assistant_turn(message.get("content")))
        elif message.get("role") == "system":  # a system turn mid-conversation (a beta Claude Code uses)
            chat.append({"role": "system", "content": _text(message.get("content"))})
        else:
            chat.extend(_user_turn(message.get("content")))
    out: dict[str, Any] = {"model": model, "messages": chat, "max_completion_tokens": body.get("max_tokens")}
    for name in SAME_NAMED:
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and metadata.get("user_id"):
        out["user"] = str(metadata["user_id"])
    if body.get("tools"):
        out["tools"] = _tools(list(body["tools"]))
        if isinstance(body.get("tool_choice"), Mapping):
            _tool_choice(body["tool_choice"], out)
    return out


def chat_to_message(completion: Mapping[str, Any]) -> dict[str, Any]:
    """A chat completion as a Messages answer."""
    choices = completion.get("choices") or [{}]
    reply = choices[0].get("message") or {}
    content: list[dict[str, Any]] = []
    if reply.get("content"):
        content.append({"type": "text", "text": str(reply["content"])})
    for call in reply.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": str(call.get("id", "")), "name": str(function.get("name", "")),
                        "input": tool_input(function.get("arguments"))})
    return {
        "id": "msg_" + str(completion.get("id", "")).removeprefix("chatcmpl-"), "type": "message", "role": "assistant",
        "model": completion.get("model"), "content": content,
        "stop_reason": stop_reason(choices[0].get("finish_reason")), "stop_sequence": None,
        "usage": usage_to_anthropic(completion.get("usage")),
    }


def tool_input(arguments: Any) -> Any:
    """A call's arguments as the object Anthropic's `input` holds; text that is not a
    JSON object (a model's slip) is kept under `_raw` rather than dropped."""
    try:
        parsed = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"_raw": str(arguments)}
    return parsed if isinstance(parsed, dict) else {"_raw": str(arguments)}
