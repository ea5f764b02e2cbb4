"""Per pool replica, the prompt blocks recently routed there: the router's picture of
what each replica's prefix cache holds (llm-d's "approximate" prefix scorer).

Each replica's index is an LRU bounded by that replica's KV capacity in blocks (from
`vllm:cache_config_info`, or the policy). Blocks are touched tail first, so a prompt's
shared head is the most recent and is forgotten last - as vLLM frees a finished
request's blocks tail first, so shared prefixes outlive their tails.

State, but no I/O: the pool (upstreams/pool.py) owns one and feeds it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    def __init__(self) -> None:
        self._blocks: dict[str, OrderedDict[bytes, None]] = {}
        self._capacity: dict[str, int] = {}

    def resize(self, replica: str, capacity_blocks: int) -> None:
        self._capacity[replica] = max(1, capacity_blocks)
        self._trim(replica)

    def capacity(self, replica: str) -> int | None:
        return self._capacity.get(replica)

    def matched(self, replica: str, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of `hashes` the replica was sent recently."""
        blocks = self._blocks.get(replica)
        if not blocks:
            return 0
        count = 0
        for block in hashes:
            if block not in blocks:
                break
            count += 1
        return count

    def record(self, replica: str, hashes: Sequence[bytes]) -> None:
        blocks = self._blocks.get(replica)
        if blocks is None:
            blocks = self._blocks[replica] = OrderedDict()
        for block in reversed(hashes):
            if block in blocks:
                blocks.move_to_end(block)
            else:
                blocks[block] = None
        self._trim(replica)

    def forget(self, replica: str) -> None:
        """The replica's cache is gone (it restarted, or left the pool)."""
        self._blocks.pop(replica, None)

    def drop(self, replica: str) -> None:
        self.forget(replica)
        self._capacity.pop(replica, None)

    def size(self, replica: str) -> int:
        return len(self._blocks.get(replica, ()))

    def _trim(self, replica: str) -> None:
        blocks = self._blocks.get(replica)
        capacity = self._capacity.get(replica)
        if blocks is None or capacity is None:
            return
        while len(blocks) > capacity:
            blocks.popitem(last=False)
