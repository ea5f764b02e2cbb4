"""A request's reservation, from its arrival to its end, as one async context manager
(STYLE.md habit 7). Inside it the request is held for (`hold`); on the way out -
answered, refused, failed, a bug, or the client gone - it ends exactly once, here: its
attempts are booked (the holds settled at their usage, or released when nothing was
spent; a call whose usage never came at the gateway's estimate; a hold whose booking
never commits is expired by the sweeper), the admission estimate corrected and the
request recorded. A streamed reply outlives `Pipeline.run`: its relay ends it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType

import anyio

from gateway.accounting.hold_and_settle import UNCONFIRMED, Accounting
from gateway.accounting.tasks import TaskInfo
from gateway.admission.gate import AdmissionGate
from gateway.errors import GatewayError
from gateway.pipeline.observe import record_request
from gateway.pipeline.usage_estimate import estimate_usage
from gateway.request_context import RequestContext
from gateway.telemetry.metrics import Metrics
from gateway.tokens.counting import Tokenizers

CLIENT_LEFT = 499


def status_of(error: BaseException | None) -> int:
    """The status a request ends with: its error's, 499 when the client left, 500 for a bug."""
    if error is None:
        return 200
    if isinstance(error, GatewayError):
        return error.http_status
    return CLIENT_LEFT if isinstance(error, asyncio.CancelledError) else 500


class Reservation:
    def __init__(self, ctx: RequestContext, accounting: Accounting, admission: AdmissionGate, metrics: Metrics,
                 tokenizers: Tokenizers) -> None:
        self.ctx = ctx
        self._accounting = accounting
        self._admission = admission
        self._metrics = metrics
        self._tokenizers = tokenizers
        self._relay_ends_it = False
        self._ended = False

    async def __aenter__(self) -> Reservation:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._relay_ends_it and error is None:
            return
        # The books must be written even while the task is being cancelled (client gone).
        with anyio.CancelScope(shield=True):
            await self._end(status_of(error))

    @property
    def ended(self) -> bool:
        return self._ended

    async def hold(self, task: TaskInfo | None) -> None:
        """Hold the first target's worst case against every budget that applies."""
        await self._accounting.reserve(self.ctx, self.ctx.policy, task)

    def ended_by_relay(self) -> Callable[[int], Awaitable[None]]:
        """For a streamed reply: the request ends when its relay does, with the status
        the relay passes; leaving the context no longer ends it (unless by an error)."""
        self._relay_ends_it = True
        return self._end

    async def _end(self, status: int) -> None:
        if self._ended:  # an error after the relay took over, and the relay's own end
            return
        self._ended = True
        ctx = self.ctx
        ctx.status = status
        ctx.timeline.mark("end")
        try:
            await self._estimate_unreported()
            if ctx.task_id is not None:
                # A task's books and its spent header must include this call: wait for the commit.
                try:
                    await self._book()
                finally:
                    record_request(self._metrics, ctx)
            else:
                # The answer carries its cost and goes out first; its books and metrics
                # follow from the deferred-work queue (deferred_work.py) and commit with a later hold.
                if ctx.cache_answer is None and ctx.attempts:
                    ctx.cost_pico = self._accounting.cost(ctx)
                self._accounting.deferred.add(self._record_later)
        finally:
            await self._admission.settle(ctx, ctx.admitted)

    async def _estimate_unreported(self) -> None:
        """An attempt that reached the provider but whose usage it never reported (the
        client left, the stream was cut or timed out) is booked at the gateway's estimate:
        never at $0, never at its worst case."""
        for attempt in self.ctx.attempts:
            if attempt.usage is None and attempt.status in UNCONFIRMED:
                attempt.estimated = await estimate_usage(self.ctx.prompt, self._tokenizers, attempt.relayed_output)

    def _record_later(self) -> None:
        ctx = self.ctx
        record_request(self._metrics, ctx)
        if ctx.cache_answer is not None:
            self._accounting.book_cache_hit_later(ctx, ctx.cache_answer)
        elif ctx.attempts:
            self._accounting.settle_later(ctx)

    async def _book(self) -> None:
        """Book the call and wait for the commit."""
        ctx = self.ctx
        if ctx.cache_answer is not None:
            await self._accounting.book_cache_hit(ctx, ctx.cache_answer)
        elif ctx.attempts:
            settlement = await self._accounting.settle(ctx)
            ctx.cost_pico = settlement.cost_pico
