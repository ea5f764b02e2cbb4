"""What a pool replica will prefill, as a chain of block hashes the router can match.

vLLM caches a prompt in fixed blocks of tokens; a block's hash chains from its parent's,
and the request's `cache_salt` is mixed into the first block only, so two tenants'
identical prompts share no block (PROTOCOLS.md). The router mirrors that shape without
tokenizing (a tokenizer would cost far more than all the rest of the routing): the
prompt is rendered in prefix order - tools, then each message's role and content - and
cut into blocks of `block_tokens * BYTES_PER_TOKEN` bytes, about a KV block each
for English text. The hashes are the router's own: they only have to agree with
themselves (and with every other gateway replica), never with vLLM's.

Imports nothing from the package: a pure function of the request body.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

BYTES_PER_TOKEN = 4  # BPE tokenizers average ~4 bytes a token on English text
DEFAULT_BLOCK_TOKENS = 16  # vLLM's default block size
_ROOT = b"gateway-pool-prefix\x00"


def prompt_text(endpoint: str, body: Mapping[str, Any]) -> str:
    """The prompt as the replica will prefill it, in prefix order; "" when the request
    prefills nothing worth caching (embeddings, an empty prompt)."""
    if endpoint == "chat.completions":
        return _chat_text(body.get("messages"), body.get("tools"))
    if endpoint == "completions":
        return _completion_text(body.get("prompt"))
    return ""


def _chat_text(messages: Any, tools: Any) -> str:
    parts: list[str] = []
    if tools:
        parts.append("tools\x00" + orjson.dumps(tools).decode() + "\x00")
    if isinstance(messages, Sequence):
        for message in messages:
            if not isinstance(message, Mapping):
                continue
            parts.append(f"{message.get('role', '')}\x00{_content(message.get('content'))}")
            if message.get("tool_calls"):
                parts.append(orjson.dumps(message["tool_calls"]).decode())
            parts.append("\x00")
    return "".join(parts)


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _completion_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and prompt and all(isinstance(t, int) for t in prompt):
        return " ".join(map(str, prompt))  # token ids: their text is their own prefix
    if isinstance(prompt, Sequence):
        return "\x00".join(_completion_text(p) for p in prompt)
    return ""


def block_hashes(text: str | bytes, salt: str, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> list[bytes]:
    """Chained hashes of the full blocks of `text`; the salt is folded into the first."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    size = max(1, block_tokens) * BYTES_PER_TOKEN
    parent = hashlib.blake2b(_ROOT + salt.encode("utf-8"), digest_size=8).digest()
    hashes = []
    for start in range(0, len(data) - size + 1, size):
        parent = hashlib.blake2b(parent + data[start:start + size], digest_size=8).digest()
        hashes.append(parent)
    return hashes
