"""The Responses API as Chat Completions: a `POST /v1/responses` body checked and
turned into the chat body the runner serves (so every stage applies), and a chat
completion turned back into a Response object. Pure functions of their inputs; the
store and the stream live in their own modules.

What translates: `instructions` (a system message), `input` (a string, or message,
`function_call` and `function_call_output` items), function `tools` and
`tool_choice`, `text.format` (`json_schema` | `json_object` | `text`),
`max_output_tokens`, `temperature`, `top_p`, `parallel_tool_calls`, and the rest
listed in PASSED. Anything else is a 400 naming the field, never silently dropped."""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from typing import Any

from gateway.errors import InvalidRequest

# Fields with a chat counterpart of the same name and meaning.
PASSED = ("temperature", "top_p", "parallel_tool_calls", "user", "seed", "prompt_cache_key", "safety_identifier",
          "service_tier", "top_logprobs")
# Fields the gateway reads itself.
OWN = ("model", "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "stream", "store",
       "previous_response_id", "metadata", "reasoning", "stream_options")
# Fields whose default is the only behaviour a chat upstream has: accepted when they ask for it.
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {"truncation": ("disabled", None), "background": (False, None),
                                            "include": ([], None)}
KNOWN = frozenset((*PASSED, *OWN, *DEFAULT_ONLY))
MESSAGE_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
MAX_OUTPUT_TOKENS = 10_000_000


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def check_request(body: Mapping[str, Any]) -> None:
    """A precise 400 for what the gateway cannot serve as asked."""
    for name in body:
        if name not in KNOWN:
            raise InvalidRequest(f"`{name}` is not supported by this gateway's Responses API", param=name)
    for name, allowed in DEFAULT_ONLY.items():
        if name in body and body[name] not in allowed:
            raise InvalidRequest(f"`{name}`: only {allowed[0]!r} is supported", param=name)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("`model` is required and must be a non-empty string", param="model")
    if "input" not in body and not body.get("previous_response_id"):
        raise InvalidRequest("`input` is required", param="input")
    for name in ("stream", "store"):
        if name in body and not isinstance(body[name], bool):
            raise InvalidRequest(f"`{name}` must be true or false", param=name)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("`instructions` must be a string", param="instructions")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise InvalidRequest("`previous_response_id` must be a response id", param="previous_response_id")
    bound = body.get("max_output_tokens")
    if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or not 1 <= bound <= MAX_OUTPUT_TOKENS):
        raise InvalidRequest(f"`max_output_tokens` must be an integer from 1 to {MAX_OUTPUT_TOKENS}", param="max_output_tokens")
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise InvalidRequest("`metadata` must be an object of strings", param="metadata")


def input_items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """This turn's input as items (a string is one user message), each checked."""
    raw = body.get("input", [])
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": raw}]}]
    if not isinstance(raw, list):
        raise InvalidRequest("`input` must be a string or a list of items", param="input")
    return [_item(i, item) for i, item in enumerate(raw)]


def _item(i: int, item: Any) -> dict[str, Any]:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise InvalidRequest(f"`{where}` must be an object", param=where)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in MESSAGE_ROLES:
            raise InvalidRequest(f"`{where}.role` must be one of {', '.join(MESSAGE_ROLES)}", param=f"{where}.role")
        content = item.get("content")
        if isinstance(content, str):
            content = [{"type": "output_text" if role == "assistant" else "input_text", "text": content}]
        if not isinstance(content, list):
            raise InvalidRequest(f"`{where}.content` must be a string or a list of parts", param=f"{where}.content")
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "input_image", "refusal"):
                raise InvalidRequest(f"`{where}.content[{j}]`: only input_text, output_text, refusal and input_image parts "
                                     "are supported", param=f"{where}.content[{j}]")
        return {"type": "message", "role": role, "content": content, **({"id": item["id"]} if "id" in item else {})}
    if kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            if not isinstance(item.get(name), str):
                raise InvalidRequest(f"`{where}.{name}` must be a string", param=f"{where}.{name}")
        return {k: item[k] for k in ("type", "id", "call_id", "name", "arguments", "status") if k in item}
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise InvalidRequest(f"`{where}.call_id` must be a string", param=f"{where}.call_id")
        output = item.get("output")
        if not isinstance(output, str):
            raise InvalidRequest(f"`{where}.output` must be a string", param=f"{where}.output")
        return {"type": "function_call_output", "call_id": item["call_id"], "output": output}
    raise InvalidRequest(f"`{where}.type` `{kind}` is not supported (message, function_call, function_call_output)",
                         param=f"{where}.type")


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as chat messages; consecutive function calls make one assistant turn."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        kind = item["type"]
        if kind == "message":
            out.append({"role": MESSAGE_ROLES[item["role"]], "content": _chat_content(item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant" and isinstance(last.get("content"), str):
                last["tool_calls"] = [call]  # the text the model said before calling
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return out


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(p["type"] != "input_image" for p in parts):
        return "".join(str(p.get("text") or p.get("refusal") or "") for p in parts)
    converted: list[dict[str, Any]] = []
    for p in parts:
        if p["type"] == "input_image":
            converted.append({"type": "image_url", "image_url": {"url": p.get("image_url") or "", "detail": p.get("detail", "auto")}})
        else:
            converted.append({"type": "text", "text": str(p.get("text") or p.get("refusal") or "")})
    return converted


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest("`tools` must be a list", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise InvalidRequest(f"`tools[{i}]`: only function tools (`{{type: function, name, parameters}}`) are supported",
                                 param=f"tools[{i}]")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequest("`tool_choice` must be auto, none, required or {type: function, name}", param="tool_choice")


def response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt, dict) and isinstance(fmt.get("name"), str) and isinstance(fmt.get("schema"), dict):
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest("`text.format` must be {type: text}, {type: json_object} or {type: json_schema, name, schema}",
                         param="text.format")


def chat_body(body: Mapping[str, Any], conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request for this turn: `conversation` holds every earlier turn's items
    and this turn's input."""
    chat: dict[str, Any] = {"model": body["model"], "messages": chat_messages(body.get("instructions"), conversation)}
    if not chat["messages"]:
        raise InvalidRequest("`input` is empty: there is nothing to answer", param="input")
    for name in PASSED:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("tools"):
        chat["tools"] = chat_tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = chat_tool_choice(body["tool_choice"])
    fmt = response_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort"):
        chat["reasoning_effort"] = reasoning["effort"]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the response's usage comes from it
    return chat


def usage_of(chat_usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not chat_usage:
        return None
    prompt = int(chat_usage.get("prompt_tokens") or 0)
    completion = int(chat_usage.get("completion_tokens") or 0)
    cached = int((chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    reasoning = int((chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": prompt + completion}


def message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id or new_id("msg"), "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def function_call_item(call_id: str, name: str, arguments: str, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id or new_id("fc"), "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


def output_of(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    content = message.get("content")
    if isinstance(content, str) and content:
        out.append(message_item(content))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        out.append(function_call_item(str(call.get("id") or new_id("call")), str(function.get("name") or ""),
                                      str(function.get("arguments") or "")))
    if not out:
        out.append(message_item(""))
    return out


def response_object(response_id: str, body: Mapping[str, Any], *, model: str, output: list[dict[str, Any]],
                    finish_reason: str | None, usage: dict[str, Any] | None, status: str | None = None,
                    created_at: int | None = None) -> dict[str, Any]:
    """A Response as OpenAI shapes one. `status` overrides what `finish_reason` says
    (`in_progress` while streaming)."""
    incomplete = finish_reason == "length"
    return {
        "id": response_id, "object": "response", "created_at": created_at or int(time.time()),
        "status": status or ("incomplete" if incomplete else "completed"),
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete and status is None else None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "model": model, "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "truncation": body.get("truncation") or "disabled",
        "usage": usage, "user": body.get("user"), "metadata": body.get("metadata") or {},
    }


def from_chat_completion(response_id: str, body: Mapping[str, Any], completion: Mapping[str, Any], model: str) -> dict[str, Any]:
    choices = completion.get("choices") or [{}]
    choice = choices[0]
    return response_object(response_id, body, model=model, output=output_of(choice.get("message") or {}),
                            finish_reason=choice.get("finish_reason"), usage=usage_of(completion.get("usage")))
