"""Holds made ahead of demand, so that a request need not wait for a commit of its own.

Money is held durably before every upstream call (DESIGN.md). Under load many holds
share one commit; at low concurrency nobody shares it, and its fsync is most of what the
gateway adds to a call. So once a request has held, this process holds once more in the
background, sized for the next request like it (same API key, model, route and tenant
budget). That request draws on the hold in memory - the money was held durably before
its call all the same - and the next hold is made behind it.

Where it stops, and what it costs:
- Only while the budget has room for `AMPLE_HOLDS` such holds (the hold's own
  conditional update checks it, atomically): near its end every request holds exactly
  its own worst case, and nobody is refused for money held ahead.
- At most one per (key, model, route, budget) in a process, released when unused for
  the policy's `defaults.hold_ahead_s`; all of them when the gateway stops.
- A crash leaves it open, as it leaves a call in flight: the sweeper expires it at its
  worst case as `unconfirmed`, with a reason that says it was held ahead, and
  reconciliation shows whether the provider billed a call for it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from gateway.accounting.headroom import AMPLE_HOLDS
from gateway.accounting.ledger import AHEAD, BudgetClaim, Hold, HoldRequest, Ledger
from gateway.accounting.spool import SettlementSpool
from gateway.accounting.writer import LedgerUnavailable, Refusal

log = logging.getLogger("gateway.ledger")
MAX_READY = 1024


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


class HoldsAhead:
    def __init__(self, ledger: Ledger, spool: SettlementSpool, max_ready: int = MAX_READY) -> None:
        self.ledger = ledger
        self.spool = spool
        self.max_ready = max_ready
        self._ready: dict[AheadKey, _Ready] = {}
        self._making: dict[AheadKey, asyncio.Future[None]] = {}  # resolved once the hold is in (or refused)
        self._releasing: set[asyncio.Task[None]] = set()
        self._waited: set[AheadKey] = set()

    async def draw(self, key: AheadKey, amount_pico: int, tokens: int, expires_mono: float, request_id: str) -> Hold | None:
        """The hold made ahead for `key`, if it covers this request until `expires_mono`
        (its deadline and grace, on the monotonic clock).
        One that is being made is waited for - its commit is under way, so that is
        sooner than a hold of the request's own - by one request at a time."""
        making = self._making.get(key)
        if making is not None and key not in self._waited:
            self._waited.add(key)
            try:
                await asyncio.shield(making)
            finally:
                self._waited.discard(key)
        return self.take(key, amount_pico, tokens, expires_mono, request_id)

    def take(self, key: AheadKey, amount_pico: int, tokens: int, expires_mono: float, request_id: str) -> Hold | None:
        """The hold made ahead for `key`, if there is one and it covers this request."""
        ready = self._ready.get(key)
        if ready is None or ready.hold.amount_pico < amount_pico or ready.hold.tokens < tokens or ready.expires_mono < expires_mono:
            return None
        del self._ready[key]
        ready.timer.cancel()
        hold = ready.hold
        return Hold(hold.id, hold.amount_pico, hold.tokens, hold.budget_ids, hold.headroom_pico, claimed_by=request_id)

    def prepare(self, key: AheadKey, claim: BudgetClaim, amount_pico: int, tokens: int, window_s: float,
                lifetime_s: float) -> None:
        """Hold for the next request like this one, in the background: released if none
        draws on it within `window_s`. `lifetime_s`: how long a request that draws on it
        may take, its grace before expiry included.

        No task: the hold is queued for the ledger writer in the loop's next turn (once
        this request's upstream call is on the wire) and published by the commit's own
        callback; `_making` keeps a future for a request that must wait for it."""
        if key in self._ready or key in self._making or len(self._ready) + len(self._making) >= self.max_ready:
            return
        loop = asyncio.get_running_loop()
        made = self._making[key] = loop.create_future()
        loop.call_soon(self._submit, key, claim, amount_pico, tokens, window_s, lifetime_s, made)

    def _submit(self, key: AheadKey, claim: BudgetClaim, amount_pico: int, tokens: int, window_s: float,
                lifetime_s: float, made: asyncio.Future[None]) -> None:
        now = datetime.now(UTC)
        expires_mono = time.monotonic() + window_s + lifetime_s
        request = HoldRequest(
            request_id=AHEAD + secrets.token_hex(12), tenant=key.tenant, key_id=key.key_id, task_id=None, model=key.model,
            upstream_model=key.upstream_model, upstream=key.upstream, endpoint=key.endpoint, amount_pico=amount_pico,
            tokens=tokens, prompt_tokens_est=0, expires_at=now + timedelta(seconds=window_s + lifetime_s), now=now,
            margin_pico=amount_pico * AMPLE_HOLDS)
        try:
            committing = self.ledger.reserve_soon(request, [claim])
        except Exception:  # a shortcut missed, never a request failed: requests hold for themselves
            log.exception("could not hold ahead for %s on %s", key.key_id, key.model)
            self._made(key, made)
            return
        committing.add_done_callback(lambda done: self._committed(key, done, window_s, expires_mono, made))

    def _committed(self, key: AheadKey, done: asyncio.Future[Hold], window_s: float, expires_mono: float,
                   made: asyncio.Future[None]) -> None:
        try:
            if done.cancelled():
                return
            error = done.exception()
            if error is None:
                hold = done.result()
                timer = asyncio.get_running_loop().call_later(window_s, self._unused, key, hold)
                self._ready[key] = _Ready(hold, expires_mono, timer)
            elif not isinstance(error, (Refusal, LedgerUnavailable)):  # refused, or the ledger down: no shortcut
                log.error("could not hold ahead for %s on %s", key.key_id, key.model, exc_info=error)
        finally:
            self._made(key, made)

    def _made(self, key: AheadKey, made: asyncio.Future[None]) -> None:
        del self._making[key]
        if not made.done():  # a cancelled gather in `_unclaim` cancels it; the hold is published all the same
            made.set_result(None)

    def _unused(self, key: AheadKey, hold: Hold) -> None:
        ready = self._ready.get(key)
        if ready is not None and ready.hold.id == hold.id:
            del self._ready[key]
            self._release([hold])

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
        await asyncio.gather(*(task for key, task in self._making.items() if match(key)), return_exceptions=True)
        unused = [self._ready.pop(key) for key in [key for key in self._ready if match(key)]]
        for ready in unused:
            ready.timer.cancel()
        return [ready.hold for ready in unused]

    def held(self) -> int:
        """Holds made ahead and not drawn on yet."""
        return len(self._ready)

    async def drain(self) -> None:
        """Release every hold not drawn on, once those being made are in: at shutdown."""
        while self._making or self._ready or self._releasing:
            unused = await self._unclaim(lambda key: True)
            if unused:
                self._release(unused)
            await asyncio.gather(*self._releasing, return_exceptions=True)
