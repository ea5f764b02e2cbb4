"""OpenAI-style automatic prompt caching for the hosted simulator.

OpenAI caches prompts of 1024 tokens or more, and a hit covers the longest previously
seen prefix in 128-token increments. Entries are scoped by model and
`prompt_cache_key` and bounded with LRU eviction.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

MIN_CACHED_TOKENS = 1024
CACHE_INCREMENT = 128


@dataclass
class HostedPromptCache:
    max_entries: int = 100_000
    _seen: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    def clear(self) -> None:
        self._seen.clear()

    def lookup_and_store(self, scope: str, tokens: Sequence[int]) -> int:
        """Cached tokens for this prompt; remembers its prefixes for later requests."""
        if len(tokens) < MIN_CACHED_TOKENS:
            return 0
        running = hashlib.sha256(scope.encode())
        start, cached = 0, 0
        for end in range(MIN_CACHED_TOKENS, len(tokens) + 1, CACHE_INCREMENT):
            running.update(array("I", tokens[start:end]).tobytes())
            start = end
            key = running.digest()
            if key in self._seen:
                self._seen.move_to_end(key)
                cached = end
            else:
                self._seen[key] = None
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)
        return cached
