"""How big a request's prompt is: a free upper bound at once, the tokenizer's count
only when a decision needs it.

Counting a 1k-token prompt costs ~0.3 ms of CPU - half of what the whole gateway may
spend on a request - and most requests never need the exact figure: a budget with
plenty left can hold against the bound (see accounting/headroom.py). Token-per-minute
limits, prompt-length routes and budgets near their end ask for the count; it is
computed once per request and kept.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.accounting.tokens import Tokenizers
from gateway.pipeline.parse import estimate_prompt_tokens, prompt_tokens_bound

# Counting a prompt this large (in UTF-8 bytes) runs off the event loop.
OFF_LOOP_BYTES = 256 * 1024


class PromptSize:
    __slots__ = ("_body", "_counted", "_encoding", "_endpoint", "_tokenizers", "bound")

    def __init__(self, endpoint: str, body: dict[str, Any], encoding: str, tokenizers: Tokenizers | None,
                 bound: int | None = None) -> None:
        self.bound = prompt_tokens_bound(endpoint, body) if bound is None else bound
        self._counted: int | None = None
        self._endpoint, self._body, self._encoding, self._tokenizers = endpoint, body, encoding, tokenizers

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
                encoder = await self._tokenizers.get(self._encoding)
                if self.bound >= OFF_LOOP_BYTES:
                    self._counted = await asyncio.to_thread(estimate_prompt_tokens, self._endpoint, self._body, encoder)
                else:
                    self._counted = estimate_prompt_tokens(self._endpoint, self._body, encoder)
        return self._counted
