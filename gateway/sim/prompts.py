"""Prompt rendering and tokenization used by the simulated prompt caches.

Chat messages are rendered with a ChatML-style template (what many vLLM-served models
use) so the token ids, and therefore the cache block hashes, depend on every byte of
tools, roles and content in prefix order, as the real caches' do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gateway.tokens.counting import get_encoding


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) if isinstance(part, Mapping) else "" for part in content
        )
    return ""


def render_chat(messages: Sequence[Any], tools: Any = None) -> str:
    parts: list[str] = []
    if tools:
        parts.append("<|im_start|>system\n# Tools\n" + orjson.dumps(tools).decode() + "<|im_end|>\n")
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        text = _content_text(message.get("content"))
        if message.get("tool_calls"):
            text += orjson.dumps(message["tool_calls"]).decode()
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{text}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def token_ids(prompt: str | Sequence[int], encoding: str = "o200k_base") -> list[int]:
    """Token ids of a text prompt; a prompt given as token ids is used as is."""
    if isinstance(prompt, str):
        return get_encoding(encoding).encode_ordinary(prompt)
    return list(prompt)
