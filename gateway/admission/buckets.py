"""Token buckets for requests-per-minute and tokens-per-minute limits: the `Buckets`
seam, the bucket arithmetic both implementations share, and the exact in-process
implementation used when the gateway runs as one process.

A bucket holds up to `capacity` tokens and refills continuously at `refill_per_s`.
Admission borrows an estimate (`take`), and settlement returns the difference
(`adjust`): a refund is capped at capacity, an extra debit may leave the bucket
negative - debt that later admissions wait out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.types.limits import BucketSpec


@dataclass(frozen=True, slots=True)
class TakeResult:
    granted: bool
    # If refused: seconds until the whole take could succeed (max over its buckets), the
    # honest retry-after; math.inf when some amount exceeds its bucket's capacity (or the
    # bucket never refills), i.e. the request can never be admitted.
    wait_s: float
    remaining: dict[str, float]  # per bucket key, after the take (current level if refused)
    reset_s: dict[str, float]  # per bucket key: seconds until the bucket is full again

    @property
    def admissible(self) -> bool:
        """False when waiting cannot help (the request is larger than a bucket)."""
        return math.isfinite(self.wait_s)


class Buckets(Protocol):
    # What the store raises when it cannot be reached: the gate answers those with 503.
    unreachable: tuple[type[Exception], ...]

    async def take(self, takes: Sequence[tuple[BucketSpec, float]], now: float | None = None) -> TakeResult:
        """Take every amount, or none of them (atomically across all the given buckets).

        `now` is for tests and simulations; production callers omit it and the store
        uses its own clock.
        """
        ...

    async def adjust(self, spec: BucketSpec, delta: float) -> None:
        """delta > 0 refunds (capped at capacity); delta < 0 debits (may go negative)."""
        ...

    async def peek(self, spec: BucketSpec) -> tuple[float, float]:
        """(remaining, seconds until full), without changing anything."""
        ...


# --- the arithmetic, shared by both stores (the Lua script mirrors it line for line) ---


def refilled(tokens: float, since: float, now: float, spec: BucketSpec) -> float:
    """Level at `now` of a bucket that held `tokens` at `since`."""
    # A clock that steps backwards must not create tokens, so elapsed never goes below 0.
    elapsed = max(0.0, now - since)
    return min(spec.capacity, tokens + elapsed * spec.refill_per_s)


def wait_for(tokens: float, amount: float, spec: BucketSpec) -> float:
    """Seconds until a bucket at `tokens` can give `amount` (0 if it can now)."""
    if tokens >= amount:
        return 0.0
    if amount > spec.capacity or spec.refill_per_s <= 0:
        return math.inf
    return (amount - tokens) / spec.refill_per_s


def seconds_to_full(tokens: float, spec: BucketSpec) -> float:
    if tokens >= spec.capacity:
        return 0.0
    if spec.refill_per_s <= 0:
        return math.inf
    return (spec.capacity - tokens) / spec.refill_per_s


def merge_takes(takes: Iterable[tuple[BucketSpec, float]]) -> list[tuple[BucketSpec, float]]:
    """One entry per bucket key (amounts summed), so a bucket named twice is charged once, for both."""
    merged: dict[str, tuple[BucketSpec, float]] = {}
    for spec, amount in takes:
        if not (math.isfinite(amount) and amount >= 0):
            raise ValueError(f"take amounts must be finite and >= 0, got {amount} for {spec.key}")
        previous = merged.get(spec.key)
        merged[spec.key] = (spec, amount + (previous[1] if previous else 0.0))
    return list(merged.values())


@dataclass(slots=True)
class _Level:
    tokens: float
    since: float
    spec: BucketSpec  # the latest spec seen, so a sweep can tell whether the bucket is full


class InProcessBuckets:
    """Exact buckets for a single process: `take` runs without an await, so it is atomic
    with respect to every other coroutine on the loop."""

    # Full buckets are forgotten (absent means full) on a sweep every this many calls,
    # so memory follows the active keys, not every tenant ever seen.
    _SWEEP_EVERY = 1024
    unreachable: tuple[type[Exception], ...] = ()  # nothing to reach

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._levels: dict[str, _Level] = {}
        self._calls = 0

    async def take(self, takes: Sequence[tuple[BucketSpec, float]], now: float | None = None) -> TakeResult:
        now = self._clock() if now is None else now
        self._maybe_sweep(now)
        merged = merge_takes(takes)
        current = {spec.key: self._level(spec, now) for spec, _ in merged}
        wait = max((wait_for(current[spec.key], amount, spec) for spec, amount in merged), default=0.0)
        granted = wait == 0.0
        if granted:
            for spec, amount in merged:
                current[spec.key] -= amount
                self._store(spec, current[spec.key], now)
        return TakeResult(
            granted=granted,
            wait_s=0.0 if granted else wait,
            remaining=dict(current),
            reset_s={spec.key: seconds_to_full(current[spec.key], spec) for spec, _ in merged},
        )

    async def adjust(self, spec: BucketSpec, delta: float) -> None:
        now = self._clock()
        self._store(spec, min(spec.capacity, self._level(spec, now) + delta), now)

    async def peek(self, spec: BucketSpec) -> tuple[float, float]:
        tokens = self._level(spec, self._clock())
        return tokens, seconds_to_full(tokens, spec)

    def _level(self, spec: BucketSpec, now: float) -> float:
        level = self._levels.get(spec.key)
        return spec.capacity if level is None else refilled(level.tokens, level.since, now, spec)

    def _store(self, spec: BucketSpec, tokens: float, now: float) -> None:
        level = self._levels.get(spec.key)
        # Keep the later timestamp: see `refilled` on clocks that step backwards.
        self._levels[spec.key] = _Level(tokens, now if level is None else max(level.since, now), spec)

    def _maybe_sweep(self, now: float) -> None:
        self._calls += 1
        if self._calls % self._SWEEP_EVERY:
            return
        full = [key for key, lv in self._levels.items() if refilled(lv.tokens, lv.since, now, lv.spec) >= lv.spec.capacity]
        for key in full:
            del self._levels[key]
