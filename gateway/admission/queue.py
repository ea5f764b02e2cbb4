"""The bounded wait in front of the buckets: a request that cannot take its buckets now
waits - at most `max_wait_s`, never past its deadline, with at most `max_queue` others
of its scope (tenant) - and is otherwise refused at once with an honest retry-after.

Waiters sleep until the buckets say capacity will be there (or until an in-process
refund wakes them), then try again; nothing spins. `interactive` requests go before
`batch` ones: a batch request does not take while an interactive request of the same
scope is waiting. State exists only for scopes with waiters, so memory stays bounded
by the waiters themselves.

Newcomers may take capacity ahead of earlier waiters (no strict FIFO), which avoids
head-of-line blocking between a tenant's requests for different models; the cost is
that a large request can be overtaken by small ones until its max wait runs out, and
it is then refused with the buckets' current wait as its retry-after.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.admission.buckets import Buckets, TakeResult, merge_takes, seconds_to_full, wait_for
from gateway.admission.limits import retry_after_header
from gateway.errors import RateLimited
from gateway.types.limits import BucketSpec

INTERACTIVE = "interactive"
BATCH = "batch"
PRIORITIES = (INTERACTIVE, BATCH)

# A floor on each sleep, so float rounding in a bucket's wait cannot turn into a tight loop.
_MIN_SLEEP_S = 0.001


class Refused(RateLimited):
    """The request cannot be admitted within its limits; a 429 with `retry_after_s`.

    `reason` is "queue_full", "wait_too_long" (the buckets need longer than the request
    may wait) or "too_large" (an amount exceeds a bucket's capacity: retry_after_s is
    infinite and waiting can never help).
    """

    def __init__(self, retry_after_s: float, result: TakeResult, reason: str) -> None:
        if math.isinf(retry_after_s):
            message = "request exceeds a rate limit's capacity and can never be admitted; reduce it"
        else:
            message = f"rate limit reached ({reason}); retry after {retry_after_s:.3f}s"
        super().__init__(message, headers=retry_after_header(retry_after_s))
        self.retry_after_s = retry_after_s
        self.result = result
        self.reason = reason

    def response_headers(self) -> dict[str, str]:
        headers = super().response_headers()
        if math.isinf(self.retry_after_s):
            headers["x-should-retry"] = "false"  # the same request can never fit
        return headers


@dataclass(eq=False, slots=True)
class _Waiter:
    priority: str
    keys: frozenset[str]


@dataclass(slots=True)
class _ScopeState:
    waiters: list[_Waiter] = field(default_factory=list)
    # Replaced on every notify, so each sleeper waits on the event current when it slept.
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def interactive_waiting(self) -> bool:
        return any(w.priority == INTERACTIVE for w in self.waiters)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class AdmissionQueue:
    def __init__(self, buckets: Buckets, clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets = buckets
        self._clock = clock  # the clock `deadline` is on; only durations cross into the buckets
        self._scopes: dict[str, _ScopeState] = {}

    @property
    def unreachable(self) -> tuple[type[Exception], ...]:
        """What the buckets' store raises when it cannot be reached."""
        return self._buckets.unreachable

    def waiting(self, scope: str) -> int:
        state = self._scopes.get(scope)
        return len(state.waiters) if state else 0

    async def admit(
        self,
        scope: str,
        takes: Sequence[tuple[BucketSpec, float]],
        *,
        max_queue: int,
        max_wait_s: float,
        deadline: float,
        priority: str = INTERACTIVE,
    ) -> TakeResult:
        """Take `takes` now or after a bounded wait; raise `Refused` if that cannot be."""
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, got {priority!r}")
        give_up_at = min(deadline, self._clock() + max_wait_s)
        if self._yields(scope, priority):
            result = await self._estimate(takes)
        else:
            result = await self._buckets.take(takes)
            if result.granted:
                return result
        if not result.admissible:
            raise Refused(math.inf, result, "too_large")
        if self.waiting(scope) >= max_queue:
            raise Refused(result.wait_s, result, "queue_full")
        self._refuse_if_late(result, give_up_at)
        return await self._wait(scope, takes, priority, give_up_at, result)

    async def adjust(self, spec: BucketSpec, delta: float) -> None:
        """Settle a bucket (see `Buckets.adjust`) and wake waiters a refund may now admit."""
        await self._buckets.adjust(spec, delta)
        if delta > 0:
            for state in self._scopes.values():
                if any(spec.key in w.keys for w in state.waiters):
                    state.notify()

    async def _wait(
        self, scope: str, takes: Sequence[tuple[BucketSpec, float]], priority: str, give_up_at: float, result: TakeResult
    ) -> TakeResult:
        state = self._scopes.setdefault(scope, _ScopeState())
        waiter = _Waiter(priority, frozenset(spec.key for spec, _ in takes))
        state.waiters.append(waiter)
        try:
            while True:
                yielding = self._yields(scope, priority)
                # A yielding batch request sleeps until the interactive waiters are gone.
                until = give_up_at if yielding else min(give_up_at, self._clock() + max(result.wait_s, _MIN_SLEEP_S))
                await _sleep_until_notified(state.changed, until - self._clock())
                if self._yields(scope, priority):
                    if self._clock() >= give_up_at:
                        estimate = await self._estimate(takes)
                        raise Refused(estimate.wait_s, estimate, "wait_too_long")
                    continue
                result = await self._buckets.take(takes)
                if result.granted:
                    return result
                self._refuse_if_late(result, give_up_at)
        finally:
            self._leave(scope, state, waiter)

    def _yields(self, scope: str, priority: str) -> bool:
        state = self._scopes.get(scope)
        return priority == BATCH and state is not None and state.interactive_waiting()

    def _refuse_if_late(self, result: TakeResult, give_up_at: float) -> None:
        if not result.admissible:
            raise Refused(math.inf, result, "too_large")
        if self._clock() + result.wait_s > give_up_at:
            raise Refused(result.wait_s, result, "wait_too_long")

    def _leave(self, scope: str, state: _ScopeState, waiter: _Waiter) -> None:
        state.waiters.remove(waiter)
        if not state.waiters:
            if self._scopes.get(scope) is state:
                del self._scopes[scope]
        elif waiter.priority == INTERACTIVE and not state.interactive_waiting():
            state.notify()  # batch waiters may take now

    async def _estimate(self, takes: Sequence[tuple[BucketSpec, float]]) -> TakeResult:
        """A refused TakeResult from peeks, for a batch request that did not try to take."""
        remaining: dict[str, float] = {}
        reset: dict[str, float] = {}
        wait = 0.0
        for spec, amount in merge_takes(takes):
            level, _ = await self._buckets.peek(spec)
            remaining[spec.key], reset[spec.key] = level, seconds_to_full(level, spec)
            wait = max(wait, wait_for(level, amount, spec))
        return TakeResult(granted=False, wait_s=wait, remaining=remaining, reset_s=reset)


async def _sleep_until_notified(event: asyncio.Event, seconds: float) -> None:
    if seconds <= 0:
        return
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass
