"""How big a request's prompt is: a bound for any tokenizer at once, the tiktoken count
only when a decision needs it.

The bound (tokens/prompt_bound.py) is what a budget hold covers unless the provider
counts with the same tiktoken encoding: only then may a hold use the count, and only
when the budget is near its end (accounting/headroom.py) - counting a 1k-token prompt
costs ~0.3 ms of CPU, half of what the whole gateway may spend on a request.
Token-per-minute limits and prompt-length routes also ask for the count; it is
computed once per request and kept.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.tokens.counting import Encoder, Tokenizers, count_chat_tokens, count_text_tokens
from gateway.tokens.prompt_bound import prompt_tokens_bound

# Counting a prompt this large (its bound, about its UTF-8 bytes) runs off the event loop.
OFF_LOOP_BYTES = 256 * 1024


class PromptSize:
    __slots__ = ("_body", "_counted", "_endpoint", "_tokenizers", "bound", "encoding")

    def __init__(self, endpoint: str, body: dict[str, Any], encoding: str, tokenizers: Tokenizers | None,
                 bound: int | None = None) -> None:
        self.bound = prompt_tokens_bound(endpoint, body) if bound is None else bound
        self.encoding = encoding  # the tiktoken encoding `count` counts in
        self._counted: int | None = None
        self._endpoint, self._body, self._tokenizers = endpoint, body, tokenizers

    @classmethod
    def empty(cls) -> PromptSize:
        """A request that has not been parsed (yet): no prompt."""
        return cls("embeddings", {}, "", None, bound=0)

    @property
    def counted(self) -> int | None:
        """The tokenizer's count, if something has asked for it."""
        return self._counted

    @property
    def best(self) -> int:
        """The most precise figure known without counting."""
        return self.bound if self._counted is None else self._counted

    async def count(self) -> int:
        if self._counted is None:
            if self._tokenizers is None or not self.bound:
                self._counted = self.bound
            else:
                encoder = await self._tokenizers.get(self.encoding)
                if self.bound >= OFF_LOOP_BYTES:
                    self._counted = await asyncio.to_thread(estimate_prompt_tokens, self._endpoint, self._body, encoder)
                else:
                    self._counted = estimate_prompt_tokens(self._endpoint, self._body, encoder)
        return self._counted


def estimate_prompt_tokens(endpoint: str, body: dict[str, Any], encoder: str | Encoder) -> int:
    """The prompt's tokens in a tiktoken encoding; its bound for any byte-level
    tokenizer is tokens/prompt_bound.py's."""
    if endpoint in ("chat.completions", "messages", "messages.count_tokens"):
        tokens = count_chat_tokens(body.get("messages"), encoder)
        if isinstance(body.get("system"), str | list):  # Anthropic's system prompt, outside the messages
            tokens += count_text_tokens(orjson.dumps(body["system"]).decode(), encoder)
        tools = body.get("tools")
        if tools:
            tokens += count_text_tokens(orjson.dumps(tools).decode(), encoder)
        return tokens
    return sum(_text_tokens(item, encoder) for item in _inputs(endpoint, body))


def _inputs(endpoint: str, body: dict[str, Any]) -> list[Any]:
    value = body.get("prompt") if endpoint == "completions" else body.get("input")
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [value]  # one input given as token ids
    return value if isinstance(value, list) else [value]


def _text_tokens(item: Any, encoder: str | Encoder) -> int:
    if isinstance(item, str):
        return count_text_tokens(item, encoder)
    if isinstance(item, list):  # already token ids
        return len(item)
    return 0
