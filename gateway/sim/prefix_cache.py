"""vLLM V1 automatic prefix caching over a bounded pool of KV blocks.

Faithful to vLLM's KVCacheManager in the ways a gateway can observe:
- prompts are split into `block_size`-token blocks; only full blocks are cached;
- block hash = hash(parent hash, block token ids, extra keys), with `cache_salt`
  an extra key of block 0 only, so different salts never share a block;
- a hit is the longest run of leading blocks found, capped so at least one prompt
  token is recomputed (vLLM needs the last token's logits);
- blocks held by running requests are pinned; freed blocks go to an LRU free queue,
  tail blocks first, and keep their hash until the block is reused (evicted).

With `events` a list, it records vLLM's KV events as they happen (kv_events.py):
blocks stored once prefilled, blocks removed when evicted, all cleared on a reset.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.sim.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored


def block_hashes(tokens: Sequence[int], block_size: int, cache_salt: str | None = None, root: bytes = b"") -> list[bytes]:
    """Chained hashes of the full blocks of `tokens`."""
    hashes: list[bytes] = []
    parent = hashlib.sha256(b"vllm-sim-root" + root).digest()
    for start in range(0, len(tokens) - block_size + 1, block_size):
        digest = hashlib.sha256(parent)
        digest.update(array("I", tokens[start : start + block_size]).tobytes())
        if start == 0 and cache_salt is not None:
            digest.update(b"\x00salt\x00" + cache_salt.encode())
        parent = digest.digest()
        hashes.append(parent)
    return hashes


@dataclass
class _Allocation:
    blocks: list[int]
    hashes: list[bytes]
    hit_blocks: int
    tokens: Sequence[int]


@dataclass
class PrefixCache:
    num_blocks: int
    block_size: int = 16
    enabled: bool = True
    events: list[Any] | None = None  # a list: KV events are recorded into it, for the engine to publish
    _ref: list[int] = field(init=False)
    _hash_of: list[bytes | None] = field(init=False)
    _cached: dict[bytes, int] = field(init=False, default_factory=dict)
    _free: OrderedDict[int, None] = field(init=False)  # LRU order: evict from the front
    _requests: dict[str, _Allocation] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._ref = [0] * self.num_blocks
        self._hash_of = [None] * self.num_blocks
        self._free = OrderedDict.fromkeys(range(self.num_blocks))

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running requests (vllm:kv_cache_usage_perc)."""
        return self.used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _hits(self, hashes: Sequence[bytes], num_prompt_tokens: int) -> list[int]:
        if not self.enabled:
            return []
        limit = (num_prompt_tokens - 1) // self.block_size
        hits: list[int] = []
        for block_hash in hashes[:limit]:
            block = self._cached.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate(self, request_id: str, hashes: list[bytes], num_prompt_tokens: int, num_tokens: int,
                 tokens: Sequence[int] = ()) -> int | None:
        """Reserve blocks for `num_tokens`; returns the cached prompt tokens, or None if full."""
        hits = self._hits(hashes, num_prompt_tokens)
        need = self.blocks_needed(num_tokens) - len(hits)
        reusable = sum(1 for b in hits if self._ref[b] == 0)  # hits sitting in the free queue
        if need > len(self._free) - reusable:
            return None
        for block in hits:
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1
        fresh = [self._take_free_block() for _ in range(need)]
        self._requests[request_id] = _Allocation(hits + fresh, hashes, len(hits), tokens)
        return len(hits) * self.block_size

    def _take_free_block(self) -> int:
        block, _ = self._free.popitem(last=False)
        old = self._hash_of[block]
        if old is not None and self._cached.get(old) == block:
            del self._cached[old]  # eviction: the least recently freed block is reused
            if self.events is not None:
                self.events.append(BlockRemoved(block_hashes=[old], medium=MEDIUM_GPU))
        self._hash_of[block] = None
        self._ref[block] = 1
        return block

    def commit(self, request_id: str) -> None:
        """After prefill: the request's full prompt blocks become reusable by later requests."""
        alloc = self._requests.get(request_id)
        if alloc is None or not self.enabled:
            return
        stored: list[int] = []
        for position in range(alloc.hit_blocks, len(alloc.hashes)):
            block, block_hash = alloc.blocks[position], alloc.hashes[position]
            if block_hash not in self._cached:
                self._cached[block_hash] = block
                self._hash_of[block] = block_hash
                stored.append(position)
        if self.events is not None and stored:
            self._record_stored(alloc, stored)

    def _record_stored(self, alloc: _Allocation, positions: list[int]) -> None:
        """One BlockStored per run of consecutive blocks, chained to its parent."""
        assert self.events is not None
        runs: list[list[int]] = []
        for position in positions:
            if runs and runs[-1][-1] == position - 1:
                runs[-1].append(position)
            else:
                runs.append([position])
        size = self.block_size
        for run in runs:
            first, last = run[0], run[-1]
            self.events.append(BlockStored(
                block_hashes=[alloc.hashes[p] for p in run], parent_block_hash=alloc.hashes[first - 1] if first else None,
                token_ids=list(alloc.tokens[first * size:(last + 1) * size]), block_size=size, lora_id=None, medium=MEDIUM_GPU,
                lora_name=None))

    def free(self, request_id: str) -> None:
        """Release a finished or aborted request's blocks, tail first."""
        alloc = self._requests.pop(request_id, None)
        if alloc is None:
            return
        for block in reversed(alloc.blocks):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None

    def reset(self) -> None:
        """Forget every cached hash (vLLM's /reset_prefix_cache); running requests keep their blocks."""
        self._cached.clear()
        self._hash_of = [None] * self.num_blocks
        if self.events is not None:
            self.events.append(AllBlocksCleared())
