"""The pipeline's view of money: price a request, hold its worst case against every
budget that applies, and settle each attempt at the price in effect when it ran."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, NamedTuple

import orjson
from sqlalchemy import Engine, bindparam, text

from gateway.accounting.headroom import Headroom
from gateway.accounting.ledger import HoldRequest, Ledger, OrphanEstimate, TypicalCall, as_datetime, expiry
from gateway.accounting.money import pico_from_usd
from gateway.accounting.prices import PriceCatalog, PriceQuote
from gateway.accounting.spool import SettlementSpool
from gateway.accounting.tasks import TaskInfo, TaskStore
from gateway.accounting.writer import LedgerUnavailable
from gateway.deferred_work import DeferredWork
from gateway.errors import BudgetExceeded, GatewayError, NotFound
from gateway.request_context import Attempt, RequestContext
from gateway.routing.policy import Budget
from gateway.routing.resolved import ModelTarget, RuntimePolicy
from gateway.tokens.prompt_size import PromptSize
from gateway.types.budget import BudgetClaim, Hold
from gateway.types.cache import CachedAnswer
from gateway.types.usage import Usage

# Attempts that reached the provider but whose usage never arrived may still be billed.
log = logging.getLogger("gateway.ledger")
UNCONFIRMED = frozenset({"timeout", "cancelled", "cut", "pending"})


class TaskDeadlinePassed(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "task_deadline_passed"


class _Booking(NamedTuple):
    """What a settlement writes: `Ledger.settle`'s arguments, as the spool keeps them too."""

    holds: list[Hold]
    charged: int
    used: int
    events: list[dict[str, Any]]
    now: datetime


@dataclass(frozen=True, slots=True)
class Settlement:
    cost_pico: int
    saved_pico: int
    pending: bool


class Accounting:
    def __init__(self, ledger: Ledger, catalog: PriceCatalog, tasks: TaskStore, spool: SettlementSpool) -> None:
        self.ledger = ledger
        self.spool = spool
        self.catalog = catalog
        self.tasks = tasks
        self._quotes: OrderedDict[tuple[str, str], PriceQuote] = OrderedDict()
        self.headroom = Headroom()
        self.deferred = DeferredWork()  # answered calls waiting to be booked (deferred_work.py)
        self._pending: set[asyncio.Future[bool]] = set()  # settlements committing in the background
        self._claims: dict[tuple[str, Decimal, str, date], BudgetClaim] = {}

    def quote(self, target: ModelTarget, at: datetime) -> PriceQuote:
        # Prices change by day at the finest; cache per (model, day), bounded.
        key = (target.name, at.date().isoformat())
        quote = self._quotes.get(key)
        if quote is None:
            found = self.catalog.quote(target.name, target.upstream_model, target.price, at)
            if found is None:  # policy check refuses unpriced models; this guards reloads racing it
                raise GatewayError(f"model `{target.name}` has no price; the gateway will not serve it unbilled")
            quote = self._quotes[key] = found
            if len(self._quotes) > 4096:
                self._quotes.popitem(last=False)
        return quote

    async def task_for(self, ctx: RequestContext) -> TaskInfo | None:
        if ctx.task_id is None:
            return None
        task = await self.tasks.get(ctx.task_id)
        if task is None or task.tenant != ctx.tenant:  # same answer for foreign tasks: no existence leak
            raise NotFound(f"task `{ctx.task_id}` does not exist for this API key's tenant", param="x-task-id")
        if task.deadline_at is not None:
            left = (task.deadline_at - datetime.now(UTC)).total_seconds()
            if left <= 0:
                raise TaskDeadlinePassed(f"task `{task.id}` passed its deadline")
            ctx.deadline = min(ctx.deadline, ctx.timeline.enqueue + left)
        return task

    def claims(self, ctx: RequestContext, policy: RuntimePolicy, task: TaskInfo | None, now: datetime) -> list[BudgetClaim]:
        claims = []
        budget = policy.policy.tenants[ctx.tenant].budget
        if budget is not None:
            # Same claim for every request of a tenant's day: build it (Decimal to
            # pico-dollars, labels) once, not per request.
            key = (ctx.tenant, budget.usd, budget.period, now.date())
            claim = self._claims.get(key)
            if claim is None:
                if len(self._claims) > 4096:
                    self._claims.clear()
                claim = self._claims[key] = tenant_claim(ctx.tenant, budget, now)
            claims.append(claim)
        if task is not None:
            claims.append(BudgetClaim(task.budget_id, f"task:{task.id}", f"task `{task.id}`"))
        return claims

    def worst_case(self, ctx: RequestContext, policy: RuntimePolicy, target: ModelTarget, now: datetime) -> tuple[int, int]:
        """(pico-dollars, tokens) one attempt on `target` can cost at most."""
        prompt = hold_prompt_tokens(ctx.prompt, policy, target)
        return self.quote(target, now).worst_case_pico(prompt, ctx.max_output_tokens), prompt + ctx.max_output_tokens

    async def reserve(self, ctx: RequestContext, policy: RuntimePolicy, task: TaskInfo | None) -> None:
        """Hold the first target's worst case against every budget that applies."""
        ctx.claims = self.claims(ctx, policy, task, datetime.now(UTC))
        await self.hold_for(ctx, policy, ctx.targets[0])

    async def hold_for(self, ctx: RequestContext, policy: RuntimePolicy, target: ModelTarget) -> None:
        """Before an attempt on `target`: make the holds cover its worst case plus what
        earlier attempts cost (their real cost, or their worst case while unknown).
        The prompt is sized by its bound for any tokenizer (tokens/prompt_bound.py),
        and refused at that size if it does not fit; where the provider counts with the
        gateway's tokenizer, by the count instead once the budget nears its end
        (accounting/headroom.py). A request no budget limits gets a hold all the same,
        limiting nothing: every call is on record before it is sent."""
        now = datetime.now(UTC)
        if not ctx.claims:
            if not ctx.holds:
                needed, tokens = self.needed(ctx, policy, target, now)
                ctx.holds.append(await self._hold(ctx, policy, target, needed, tokens, now))
            return
        countable = counts_like_provider(ctx.prompt, policy, target)
        needed, tokens = self.needed(ctx, policy, target, now)
        if countable and ctx.prompt.counted is None and not self.headroom.ample(ctx.claims, needed):
            await ctx.prompt.count()
            needed, tokens = self.needed(ctx, policy, target, now)
        try:
            await self._raise_holds(ctx, policy, target, needed, tokens, now)
        except BudgetExceeded:
            self.headroom.forget(ctx.claims)
            booked = await self.book_answered()
            uncounted = countable and ctx.prompt.counted is None
            if not (uncounted or booked):
                raise  # a smaller hold would be a guess at what the provider may bill
            # Refused beside money held for calls already answered, or held against the
            # bound where a count may do: it may still fit.
            if uncounted:
                await ctx.prompt.count()
            needed, tokens = self.needed(ctx, policy, target, now)
            await self._raise_holds(ctx, policy, target, needed, tokens, now)

    def needed(self, ctx: RequestContext, policy: RuntimePolicy, target: ModelTarget, now: datetime) -> tuple[int, int]:
        needed, tokens = self.worst_case(ctx, policy, target, now)
        for attempt in ctx.attempts:
            if attempt.usage is not None:  # spent already (e.g. the answer a route escalated from)
                needed += self.quote(attempt.target, now).cost_pico(attempt.usage)
                tokens += attempt.usage.prompt_tokens + attempt.usage.completion_tokens
            elif attempt.status in UNCONFIRMED:
                extra, extra_tokens = self.worst_case(ctx, policy, attempt.target, now)
                needed, tokens = needed + extra, tokens + extra_tokens
        return needed, tokens

    async def _raise_holds(self, ctx: RequestContext, policy: RuntimePolicy, target: ModelTarget, needed: int, tokens: int,
                      now: datetime) -> None:
        held = sum(h.amount_pico for h in ctx.holds)
        if needed <= held:
            return
        hold = await self._hold(ctx, policy, target, needed - held, max(0, tokens - sum(h.tokens for h in ctx.holds)), now)
        for claim in ctx.claims:  # the smallest room left over all claims: a safe figure for each
            self.headroom.record(claim.budget_id, hold.headroom_pico)
        ctx.holds.append(hold)

    def orphan_estimate(self, policy: RuntimePolicy) -> OrphanEstimate:
        """How the sweeper prices a hold whose request never settled (its replica died
        mid-call): the prompt held for, scaled by how the model's recent calls' billed
        prompts compared with what was held for them, plus the model's mean answer
        length (never more than the call's output bound; the bound itself while nothing
        is known), at the price of the day the call started. The provider's bill for the
        call lies between nothing and the hold, and so does this estimate."""

        def estimate(row: dict[str, Any], typical: TypicalCall) -> tuple[int, tuple[int, int] | None, str]:
            target = policy.targets.get(row["model"])
            bound = row["max_output_tokens"]
            if target is None or not bound:
                return row["amount_pico"], None, "no usage was confirmed before the reservation expired; charged its worst case"
            output = bound if typical.output_tokens is None else min(bound, typical.output_tokens)
            usage = Usage(prompt_tokens=typical.prompt_tokens(row["prompt_tokens_est"]), completion_tokens=output)
            cost = self.quote(target, as_datetime(row["created_at"])).cost_pico(usage)
            if row["amount_pico"]:
                cost = min(cost, row["amount_pico"])
            known = "the output bound" if typical.output_tokens is None else "the model's mean answer"
            return cost, (usage.prompt_tokens, output), (
                f"its replica stopped before the call's usage was booked; estimated at the prompt plus {known} ({output} tokens)")

        return estimate

    def warm_headroom(self, reader: Engine, policy: RuntimePolicy, now: datetime) -> None:
        """What each tenant budget has left, read once at start-up, so the first requests
        need not count their prompts just because nothing is known yet."""
        claims = [tenant_claim(name, t.budget, now) for name, t in policy.policy.tenants.items() if t.budget is not None]
        if not claims:
            return
        query = text("SELECT id, spent_pico, reserved_pico FROM budgets WHERE id IN :ids").bindparams(bindparam("ids", expanding=True))
        with reader.connect() as conn:
            rows = {row.id: row for row in conn.execute(query, {"ids": [c.budget_id for c in claims]})}
        for claim in claims:
            row = rows.get(claim.budget_id)
            used = (row.spent_pico + row.reserved_pico) if row is not None else 0
            if claim.limit_pico is not None:
                self.headroom.record(claim.budget_id, claim.limit_pico - used)

    async def _hold(self, ctx: RequestContext, policy: RuntimePolicy, target: ModelTarget, amount: int, tokens: int,
                    now: datetime) -> Hold:
        deadline_s = max(0.0, ctx.deadline - ctx.timeline.enqueue)
        request = HoldRequest(
            request_id=ctx.request_id, tenant=ctx.tenant, key_id=ctx.key_id, task_id=ctx.task_id, model=target.name,
            upstream_model=target.upstream_model, upstream=target.upstream, endpoint=ctx.endpoint, amount_pico=amount, tokens=tokens,
            prompt_tokens_est=ctx.prompt.best, now=now,
            expires_at=expiry(deadline_s, now, policy.policy.defaults.reservation_grace_s), sequence=len(ctx.holds),
            max_output_tokens=ctx.max_output_tokens,
        )
        return await self.ledger.reserve(request, ctx.claims)

    async def settle(self, ctx: RequestContext) -> Settlement:
        """Book every attempt; end the holds unless an attempt's usage is still unknown.
        Returns once the booking is committed (or spooled)."""
        settlement, booking = self._settlement(ctx)
        await self.settle_or_spool(ctx.request_id, *booking)
        return settlement

    def settle_later(self, ctx: RequestContext) -> None:
        """`settle`, handed to the ledger writer without waiting (see `book_later`)."""
        self.book_later(ctx.request_id, self._settlement(ctx)[1])

    def _settlement(self, ctx: RequestContext) -> tuple[Settlement, _Booking]:
        hold = ctx.holds[0] if ctx.holds else None
        events, cost, saved, tokens = [], 0, 0, 0
        pending = False
        for number, attempt in enumerate(ctx.attempts, start=1):
            quote, a_cost, a_saved, at = self._priced(attempt)
            attempt.cost_pico = a_cost
            usage = attempt.usage or attempt.estimated
            if usage is None and attempt.status in UNCONFIRMED:
                pending = True
            cost += a_cost
            saved += a_saved
            tokens += (usage.prompt_tokens + usage.completion_tokens) if usage is not None else 0
            events.append(_event(ctx, attempt, number, hold, quote, a_cost, a_saved, at))
        # No refund while usage is unknown: the hold stays until the sweeper ends it.
        holds, charged, used = ([], 0, 0) if pending else (ctx.holds, cost, tokens)
        return Settlement(cost, saved, pending), _Booking(holds, charged, used, events, datetime.now(UTC))

    def cost(self, ctx: RequestContext) -> int:
        """What the attempts cost, each at the price in effect when it ran: the figure
        `settle` books, known before the books are written."""
        total = 0
        for attempt in ctx.attempts:
            attempt.cost_pico = self._priced(attempt)[1]
            total += attempt.cost_pico
        return total

    def _priced(self, attempt: Attempt) -> tuple[PriceQuote, int, int, datetime]:
        """(quote, cost, saved, when it ran) of one attempt."""
        at = datetime.fromtimestamp(attempt.timeline.wall_start, UTC)
        quote = self.quote(attempt.target, at)
        usage = attempt.usage or attempt.estimated
        if usage is None:
            return quote, 0, 0, at
        return quote, quote.cost_pico(usage), quote.saved_pico(usage), at

    async def settle_or_spool(self, request_id: str, holds: list[Hold], charged: int, used: int,
                              events: list[dict[str, Any]], now: datetime) -> None:
        """Book what was already answered, and wait for it: into the ledger, or - while
        it is down - into the local spool the sweeper replays, so no answered call goes
        unbooked."""
        try:
            await self.ledger.settle(holds, charged, used, events, now)
        except LedgerUnavailable as exc:
            self.ledger.writer.outage.failed(exc, "settlements spooled for replay")
            self.spool.write(holds, charged, used, events, now)

    def book_later(self, request_id: str, booking: _Booking) -> None:
        """`settle_or_spool` without waiting: the booking is queued for the ledger writer
        in this turn of the event loop, with no task of its own, and `flush` waits for it.

        Not waiting is how an answer goes out without an fsync of its own: the hold was
        durable before the call, and the settlement shares the commit of the next hold
        (ledger writer's linger). A crash in between leaves the hold for the sweeper to
        expire as `unconfirmed`, which reconciliation explains - as for a crash mid-call."""
        future = self.ledger.settle_later(*booking)
        self._pending.add(future)
        future.add_done_callback(lambda done: self._booked(done, request_id, booking))

    def _booked(self, future: asyncio.Future[bool], request_id: str, booking: _Booking) -> None:
        self._pending.discard(future)
        error = None if future.cancelled() else future.exception()
        if isinstance(error, LedgerUnavailable):
            self.ledger.writer.outage.failed(error, "settlements spooled for replay")
            self.spool.write(*booking)
        elif error is not None:
            log.error("background booking of %s failed", request_id, exc_info=error)

    async def book_answered(self) -> bool:
        """Book the calls this process has answered but not yet booked (deferred_work.py),
        so their holds give back what they did not spend: a client calling one call after
        another must not be refused for its previous call's hold. Whether there were any."""
        if not (len(self.deferred) or self._pending):
            return False
        await self.flush()
        return True

    async def flush(self) -> None:
        """Once this returns, every settlement handed over so far is committed (or spooled):
        readers of the ledger in this process call it first."""
        self.deferred.run()
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        await self.ledger.writer.flush()

    async def book_cache_hit(self, ctx: RequestContext, answer: CachedAnswer) -> None:
        await self.settle_or_spool(ctx.request_id, *self._cache_hit(ctx, answer))

    def book_cache_hit_later(self, ctx: RequestContext, answer: CachedAnswer) -> None:
        self.book_later(ctx.request_id, self._cache_hit(ctx, answer))

    def _cache_hit(self, ctx: RequestContext, answer: CachedAnswer) -> _Booking:
        """A hit costs nothing upstream; its row records what the upstream call it
        replaced would have cost now, as savings. No tokens: none were billed."""
        now = datetime.now(UTC)
        target = ctx.targets[0]
        usage = Usage.from_openai(answer.usage) if answer.usage else Usage()
        saved = self.quote(target, now).cost_pico(usage)
        return _Booking([], 0, 0, [{
            "request_id": ctx.request_id, "attempt": 0, "reservation_id": None, "tenant": ctx.tenant, "key_id": ctx.key_id,
            "task_id": ctx.task_id, "kind": "cache_hit", "endpoint": ctx.endpoint, "model": answer.model,
            "upstream_model": target.upstream_model, "upstream": answer.upstream, "route": ctx.route, "status": "ok",
            "http_status": 200, "usage_known": True, "prompt_tokens_est": ctx.prompt.best, "prompt_tokens": 0,
            "cached_tokens": 0, "cache_write_tokens": 0, "cache_write_1h_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cost_pico": 0,
            "saved_pico": saved, "price_source": "response cache", "created_at": now, "day": now.date().isoformat(),
            "timeline": orjson.dumps(ctx.timeline.as_offsets_ms()).decode(),
        }], now)


def counts_like_provider(prompt: PromptSize, policy: RuntimePolicy, target: ModelTarget) -> bool:
    """Whether `target`'s provider counts prompts in the encoding `prompt` counts in."""
    model = policy.policy.models.get(target.name)
    return model is not None and model.provider_tokenizer == "tiktoken" and target.tokenizer == prompt.encoding


def hold_prompt_tokens(prompt: PromptSize, policy: RuntimePolicy, target: ModelTarget) -> int:
    """The prompt tokens a hold on `target` covers: the count plus the policy's margin
    (for chat framing the count only estimates) where the provider counts like the
    gateway and the prompt has been counted; otherwise the bound for any tokenizer."""
    if prompt.counted is None or not counts_like_provider(prompt, policy, target):
        return prompt.bound
    d = policy.policy.defaults
    ratio, per = d.prompt_margin_ratio.as_integer_ratio()  # integers: exact, and cheaper than Decimal
    return min(prompt.bound, prompt.counted + prompt.counted * ratio // per + d.prompt_margin_tokens)


def tenant_claim(tenant: str, budget: Budget, now: datetime) -> BudgetClaim:
    if budget.period == "month":
        start = now.date().replace(day=1).isoformat()
    elif budget.period == "day":
        start = now.date().isoformat()
    else:
        start = ""
    label = f"tenant `{tenant}` budget" + (f" ({budget.period} from {start})" if start else "")
    return BudgetClaim(f"tenant:{tenant}:{budget.period}:{start}", f"tenant:{tenant}", label, start, pico_from_usd(budget.usd))


def _event(ctx: RequestContext, attempt: Attempt, number: int, hold: Hold | None, quote: PriceQuote,
           cost: int, saved: int, at: datetime) -> dict[str, object]:
    usage = attempt.usage or attempt.estimated or Usage()
    return {
        "request_id": ctx.request_id, "attempt": number, "reservation_id": hold.id if hold else None,
        "tenant": ctx.tenant, "key_id": ctx.key_id, "task_id": ctx.task_id, "kind": "model", "endpoint": ctx.endpoint,
        "model": attempt.target.name, "upstream_model": attempt.target.upstream_model, "upstream": attempt.target.upstream, "replica": attempt.replica,
        "provider_request_id": attempt.provider_request_id, "route": ctx.route, "status": attempt.status,
        "http_status": attempt.http_status, "error": attempt.error, "usage_known": attempt.usage is not None,
        "estimated": attempt.usage is None and attempt.estimated is not None,
        "prompt_tokens_est": ctx.prompt.best, "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens, "cache_write_tokens": usage.cache_write_tokens,
        "cache_write_1h_tokens": usage.cache_write_1h_tokens,
        "completion_tokens": usage.completion_tokens, "reasoning_tokens": usage.reasoning_tokens,
        "cost_pico": cost, "saved_pico": saved, "price_source": quote.source[:200], "created_at": at,
        "day": at.date().isoformat(), "timeline": orjson.dumps(attempt.timeline.as_offsets_ms(ctx.timeline.enqueue)).decode(),
        "checks": attempt.checks, "escalation": attempt.escalation,
    }
