"""Automatic prompt-cache breakpoints for Anthropic (a model's `auto_cache_control:
true`): Anthropic caches a prompt's prefix only up to a block marked `cache_control`,
so a client that marks none pays full input price for the same system prompt on every
call. When the client marked none anywhere, one breakpoint goes on the stable part of
the prompt - the last system block, else the last tool. A client that set its own
breakpoints chose them: they are never moved or added to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EPHEMERAL = {"type": "ephemeral"}


def _marked(value: Any) -> bool:
    """Whether `value` (a body, or any part of one) carries a `cache_control` anywhere."""
    if isinstance(value, Mapping):
        return "cache_control" in value or any(_marked(v) for v in value.values())
    if isinstance(value, list):
        return any(_marked(v) for v in value)
    return False


def _marked_last(blocks: list[Any]) -> list[Any]:
    *head, last = blocks
    return [*head, {**last, "cache_control": dict(EPHEMERAL)}]


def add_messages_breakpoint(body: dict[str, Any]) -> bool:
    """On a Messages request: the last system block (a string system prompt becomes one
    block), else the last tool. True when one was added."""
    if _marked(body.get("system")) or _marked(body.get("tools")) or _marked(body.get("messages")) or "cache_control" in body:
        return False
    system = body.get("system")
    if isinstance(system, str) and system:
        body["system"] = [{"type": "text", "text": system, "cache_control": dict(EPHEMERAL)}]
    elif isinstance(system, list) and system and isinstance(system[-1], Mapping):
        body["system"] = _marked_last(system)
    elif isinstance(body.get("tools"), list) and body["tools"] and isinstance(body["tools"][-1], Mapping):
        body["tools"] = _marked_last(body["tools"])
    else:
        return False
    return True


def add_chat_breakpoint(body: dict[str, Any]) -> bool:
    """On a chat request bound for Anthropic: the last system (or developer) message's
    last text part, which upstreams/anthropic_translate.py carries over with its mark."""
    messages = body.get("messages")
    if not isinstance(messages, list) or _marked(messages):
        return False
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if not isinstance(message, Mapping) or message.get("role") not in ("system", "developer"):
            continue
        content = message.get("content")
        if isinstance(content, str) and content:
            parts: list[Any] = [{"type": "text", "text": content}]
        elif isinstance(content, list) and content and isinstance(content[-1], Mapping):
            parts = content
        else:
            return False
        messages = list(messages)
        messages[i] = {**message, "content": _marked_last(parts)}
        body["messages"] = messages
        return True
    return False
