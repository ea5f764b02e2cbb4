"""Holds made ahead of demand, so that a request need not wait for a commit of its own.

Money is held durably before every upstream call (DESIGN.md). At low concurrency nobody
shares a hold's commit, and its fsync is most of what the gateway adds to a call; under
load the commits are shared, but each still costs the core it runs on (on this project's
machines a third of the gateway's CPU went to the ledger writer at c=16). So once a
request has held, this process holds ahead in the background, sized for the next
requests like it (same API key, model, route and tenant budget): a pool of holds per
such key, refilled once half of it is drawn, the refill's holds queued together so that
they share one commit. Those requests draw on a hold in memory - the money was held
durably before their calls all the same.

A key's pool starts at one hold and follows its demand: it doubles when a request finds
nothing ready, not even a refill to wait for (another request waits for it), up to
`MAX_DEPTH`, and halves whenever a hold goes unused for the policy's
`defaults.hold_ahead_s`. It also doubles, up to `STEADY_DEPTH`, when it is due for a
refill within `STEADY_S` of its last one: a key called steadily, even one call at a
time, then commits once per few calls instead of once per call. Each commit is an fsync
and ~0.25 ms of the ledger writer's CPU on the gateway's own core, and at one call at a
time it landed as the upstream answered: the first token waited for it (bench/RESULTS.md).
A key called now and then keeps one hold ahead; a key with many calls in flight, up to
`MAX_DEPTH`, refilled half at a time.

Where it stops, and what it costs:
- Only while the budget has room for `AMPLE_HOLDS` such holds (each hold's own
  conditional update checks it, atomically): near its end every request holds exactly
  its own worst case, and nobody is refused for money held ahead.
- At most `MAX_DEPTH` per key and `MAX_READY` in all, each released when unused for
  `defaults.hold_ahead_s`; all of them when the gateway stops.
- A crash leaves them open, as it leaves a call in flight: the sweeper expires each at
  its worst case as `unconfirmed`, with a reason that says it was held ahead, and
  reconciliation shows whether the provider billed a call for it. So a crash can book
  up to `STEADY_DEPTH` worst cases per key that no call used while calls come steadily,
  `MAX_DEPTH` under load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple, TypeVar

from gateway.accounting.headroom import AMPLE_HOLDS
from gateway.accounting.ledger import AHEAD, BudgetClaim, Hold, HoldRequest, Ledger
from gateway.accounting.spool import SettlementSpool
from gateway.accounting.writer import LedgerUnavailable, Refusal
from gateway.telemetry.ids import IdSource

log = logging.getLogger("gateway.ledger")
_V = TypeVar("_V")
MAX_READY = 1024
# A key's pool at its largest. At c=16 pools up to this size took a fifth to a quarter
# of the ledger writer's CPU per call off, against one hold per key (bench/RESULTS.md).
MAX_DEPTH = 32
# A pool due for a refill within STEADY_S of its last doubles, up to STEADY_DEPTH: then
# a refill of four holds shares one commit, and three calls in four meet none. At one
# call at a time, 8 against 1 took the added time to a first token from 0.54-0.60 to
# 0.32-0.46 ms (bench/RESULTS.md); 4 left every other call meeting a commit.
STEADY_S = 1.0
STEADY_DEPTH = 8


class AheadKey(NamedTuple):
    """What a hold made ahead is for: a request draws on it only if it matches. A tuple
    of strings, so that the lookups on every request hash in C."""

    tenant: str
    key_id: str
    endpoint: str
    model: str
    upstream_model: str
    upstream: str
    budget_id: str
    limit_pico: int | None


@dataclass(slots=True)
class _Ready:
    hold: Hold
    expires_mono: float  # its expiry, on the monotonic clock requests' deadlines use
    timer: asyncio.TimerHandle


@dataclass(slots=True)
class _Refill:
    made: asyncio.Future[None]  # resolved once every hold of the refill is in (or refused)
    pending: int


class HoldsAhead:
    def __init__(self, ledger: Ledger, spool: SettlementSpool, max_ready: int = MAX_READY, max_depth: int = MAX_DEPTH,
                 steady_s: float = STEADY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.spool = spool
        self.max_ready = max_ready
        self.max_depth = max_depth
        self.steady_s = steady_s
        self._clock = clock
        self._ready: dict[AheadKey, list[_Ready]] = {}  # oldest first
        self._making: dict[AheadKey, _Refill] = {}
        self._depth: dict[AheadKey, int] = {}  # a key's pool size, where it is over 1
        self._refilled: dict[AheadKey, float] = {}  # when a key's last refill began (`clock`)
        self._count = 0  # holds ready or being made, over all keys
        # Not `secrets` per hold: its system call lets the ledger writer take the GIL
        # between a refill's holds, which then no longer share a commit.
        self._ids = IdSource()
        self._releasing: set[asyncio.Task[None]] = set()
        self._waited: set[AheadKey] = set()

    async def draw(self, key: AheadKey, amount_pico: int, tokens: int, expires_mono: float, request_id: str) -> Hold | None:
        """A hold made ahead for `key` that covers this request until `expires_mono` (its
        deadline and grace, on the monotonic clock), if there is one.
        With none ready, a refill under way is waited for - its commit is under way, so
        that is sooner than a hold of the request's own - by one request at a time.
        A request that finds the key's pool drawn, and another request already waiting
        for its refill, gets nothing: calls come faster than the pool is refilled, so it
        doubles. (Not for the request that waits: at one call at a time the next call
        often comes while the refill commits, and a larger pool's commits, less often but
        longer, delayed first tokens by 0.03-0.05 ms on this project's machines.)"""
        refill = self._making.get(key)
        supplied = refill is not None or key in self._ready
        if refill is not None and key not in self._ready and key not in self._waited:
            self._waited.add(key)
            try:
                await asyncio.shield(refill.made)
            finally:
                self._waited.discard(key)
        hold = self.take(key, amount_pico, tokens, expires_mono, request_id)
        if hold is None and supplied:
            self._grow(key, self.max_depth)
        return hold

    def _grow(self, key: AheadKey, bound: int) -> int:
        """Double the key's pool, up to `bound`; its size."""
        depth = self._depth.get(key, 1)
        if depth < bound:
            depth = min(bound, 2 * depth)
            self._remember(self._depth, key, depth)  # when cleared, the keys start over from one hold each
        return depth

    def _remember(self, table: dict[AheadKey, _V], key: AheadKey, value: _V) -> None:
        """`table[key] = value`, at most `max_ready` keys: a new key past that starts the table over."""
        if len(table) >= self.max_ready and key not in table:
            table.clear()
        table[key] = value

    def take(self, key: AheadKey, amount_pico: int, tokens: int, expires_mono: float, request_id: str) -> Hold | None:
        """The oldest hold made ahead for `key` that covers this request, if there is one."""
        pool = self._ready.get(key)
        if pool is None:
            return None
        covering = next((i for i, ready in enumerate(pool) if ready.hold.amount_pico >= amount_pico
                         and ready.hold.tokens >= tokens and ready.expires_mono >= expires_mono), None)
        if covering is None:
            return None
        ready = pool[covering]
        self._forget(key, pool, covering)
        ready.timer.cancel()
        hold = ready.hold
        return Hold(hold.id, hold.amount_pico, hold.tokens, hold.budget_ids, hold.headroom_pico, claimed_by=request_id)

    def prepare(self, key: AheadKey, claim: BudgetClaim, amount_pico: int, tokens: int, window_s: float,
                lifetime_s: float) -> None:
        """Refill the key's pool for the next requests like this one, in the background,
        once at most half of it is left: each hold is released if none draws on it within
        `window_s`. `lifetime_s`: how long a request that draws on one may take, its
        grace before expiry included.

        No task: the holds are queued for the ledger writer in the loop's next turn (once
        this request's upstream call is on the wire), in that one turn so that they share
        a commit, and published by the commits' own callbacks; `_making` keeps a future
        for a request that must wait for them."""
        if key in self._making:
            return
        pool = self._ready.get(key)
        have = len(pool) if pool is not None else 0
        depth = self._depth.get(key, 1)
        if have > depth // 2:
            return
        now = self._clock()
        last = self._refilled.get(key)
        if last is not None and now - last < self.steady_s:
            depth = self._grow(key, STEADY_DEPTH)
        self._remember(self._refilled, key, now)
        count = min(depth - have, self.max_ready - self._count)
        if count <= 0:
            return
        loop = asyncio.get_running_loop()
        refill = self._making[key] = _Refill(loop.create_future(), count)
        self._count += count
        loop.call_soon(self._submit, key, claim, amount_pico, tokens, window_s, lifetime_s, refill)

    def _submit(self, key: AheadKey, claim: BudgetClaim, amount_pico: int, tokens: int, window_s: float,
                lifetime_s: float, refill: _Refill) -> None:
        now = datetime.now(UTC)
        expires_at, expires_mono = now + timedelta(seconds=window_s + lifetime_s), time.monotonic() + window_s + lifetime_s
        for queued in range(refill.pending):
            request = HoldRequest(
                request_id=self._ids.next(AHEAD.removesuffix("_")), tenant=key.tenant, key_id=key.key_id, task_id=None,
                model=key.model, upstream_model=key.upstream_model, upstream=key.upstream, endpoint=key.endpoint,
                amount_pico=amount_pico, tokens=tokens, prompt_tokens_est=0, expires_at=expires_at, now=now,
                margin_pico=amount_pico * AMPLE_HOLDS)
            try:
                committing = self.ledger.reserve_soon(request, [claim])
            except Exception:  # a shortcut missed, never a request failed: requests hold for themselves
                log.exception("could not hold ahead for %s on %s", key.key_id, key.model)
                for _ in range(refill.pending - queued):
                    self._done(key, refill, None, window_s, expires_mono)
                return
            committing.add_done_callback(lambda done: self._committed(key, refill, done, window_s, expires_mono))

    def _committed(self, key: AheadKey, refill: _Refill, done: asyncio.Future[Hold], window_s: float,
                   expires_mono: float) -> None:
        hold = None
        try:
            if done.cancelled():
                return
            error = done.exception()
            if error is None:
                hold = done.result()
            elif not isinstance(error, (Refusal, LedgerUnavailable)):  # refused, or the ledger down: no shortcut
                log.error("could not hold ahead for %s on %s", key.key_id, key.model, exc_info=error)
        finally:
            self._done(key, refill, hold, window_s, expires_mono)

    def _done(self, key: AheadKey, refill: _Refill, hold: Hold | None, window_s: float, expires_mono: float) -> None:
        """One hold of `refill` is in (`hold`), or was refused or never made (None)."""
        if hold is None:
            self._count -= 1
        else:
            timer = asyncio.get_running_loop().call_later(window_s, self._unused, key, hold)
            self._ready.setdefault(key, []).append(_Ready(hold, expires_mono, timer))
        refill.pending -= 1
        if refill.pending == 0:
            del self._making[key]
            if not refill.made.done():  # a cancelled gather in `_unclaim` cancels it; the holds are published all the same
                refill.made.set_result(None)

    def _forget(self, key: AheadKey, pool: list[_Ready], index: int) -> None:
        del pool[index]
        if not pool:
            del self._ready[key]
        self._count -= 1

    def _unused(self, key: AheadKey, hold: Hold) -> None:
        pool = self._ready.get(key)
        if pool is None:
            return
        for i, ready in enumerate(pool):
            if ready.hold.id == hold.id:
                self._forget(key, pool, i)
                self._release([hold])
                depth = self._depth.pop(key, 1) // 2  # more than the demand: the pool halves
                if depth > 1:
                    self._depth[key] = depth
                return

    def _release(self, holds: list[Hold]) -> None:
        task = asyncio.get_running_loop().create_task(self._give_back(holds))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _give_back(self, holds: list[Hold], *, lazy: bool = True) -> None:
        now = datetime.now(UTC)
        try:
            await self.ledger.release_unused(holds, now, lazy=lazy)
        except LedgerUnavailable:
            log.exception("ledger unavailable; the release of %d unused holds is spooled for replay", len(holds))
            self.spool.write(holds, 0, 0, [], now, unused=True)

    async def give_back(self, budget_ids: set[str]) -> bool:
        """Release, and wait for, the holds made ahead on these budgets; True if there
        were any. For a request the budget refused: a cut to the budget may have left it
        no room beside them."""
        unused = await self._unclaim(lambda key: key.budget_id in budget_ids)
        if unused:
            await self._give_back(unused, lazy=False)  # a request waits on it
        return bool(unused)

    async def _unclaim(self, match: Callable[[AheadKey], bool]) -> list[Hold]:
        """Take back the matching holds made ahead, those being made included, so that
        no request draws on them."""
        await asyncio.gather(*(refill.made for key, refill in self._making.items() if match(key)), return_exceptions=True)
        unused = [ready for key in [key for key in self._ready if match(key)] for ready in self._ready.pop(key)]
        self._count -= len(unused)
        for ready in unused:
            ready.timer.cancel()
        return [ready.hold for ready in unused]

    def held(self) -> int:
        """Holds made ahead and not drawn on yet."""
        return sum(map(len, self._ready.values()))

    async def drain(self) -> None:
        """Release every hold not drawn on, once those being made are in: at shutdown."""
        while self._making or self._ready or self._releasing:
            unused = await self._unclaim(lambda key: True)
            if unused:
                self._release(unused)
            await asyncio.gather(*self._releasing, return_exceptions=True)
