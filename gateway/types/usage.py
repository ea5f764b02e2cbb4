"""Token usage as a provider reports it, in OpenAI's terms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0  # every cache write, the 1-hour ones included
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_1h_tokens: int = 0  # of the cache writes, those kept an hour (Anthropic), billed at their own rate

    def as_openai(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": self.cache_write_tokens,
                                      "cache_write_1h_tokens": self.cache_write_1h_tokens},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
        }

    @classmethod
    def from_openai(cls, usage: dict[str, Any]) -> Usage:
        prompt = usage.get("prompt_tokens_details") or {}
        completion = usage.get("completion_tokens_details") or {}
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            cached_tokens=int(prompt.get("cached_tokens") or 0),
            cache_write_tokens=int(prompt.get("cache_write_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            reasoning_tokens=int(completion.get("reasoning_tokens") or 0),
            cache_write_1h_tokens=int(prompt.get("cache_write_1h_tokens") or 0),
        )
