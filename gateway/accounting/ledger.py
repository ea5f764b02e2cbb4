"""Reserve, then settle: the atomic budget step and the books it leaves behind.

Why a conditional SQL update rather than a Redis script: the reservation must be
durable before the upstream call starts, and the ledger database is the one store that
is durable and shared by every replica. `UPDATE budgets SET reserved = reserved + :a
WHERE id = :id AND spent + reserved + :a <= limit` is atomic per row on PostgreSQL (row
lock) and SQLite (one writer), so N replicas can never reserve past a limit, and the
hold, the reservation row and the budget counters commit together or not at all.
Group commit (see writer.py) keeps that from costing a lone fsync per request.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from functools import cache
from typing import Any

from sqlalchemy import ColumnDefault

from gateway.accounting.driver_sql import DriverSql, Row, Staged, insert_sql
from gateway.accounting.tables import reservations, usage_events
from gateway.accounting.writer import GroupCommitWriter, LedgerUnavailable, WriteRefused
from gateway.errors import BudgetExceeded, NotReady
from gateway.types.budget import BudgetClaim, Hold

ENSURE_BUDGET = (
    "INSERT INTO budgets (id, scope, period_start, limit_pico, reserved_pico, spent_pico, calls_used, tokens_reserved, tokens_used)"
    " VALUES (:id, :scope, :period_start, :limit, 0, 0, 0, 0, 0) ON CONFLICT (id) DO NOTHING"
)
HOLD = (
    "UPDATE budgets SET reserved_pico = reserved_pico + :amount, calls_used = calls_used + 1,"
    " tokens_reserved = tokens_reserved + :tokens, limit_pico = COALESCE(:limit, limit_pico)"
    " WHERE id = :id"
    " AND (COALESCE(:limit, limit_pico) IS NULL OR spent_pico + reserved_pico + :amount + :margin <= COALESCE(:limit, limit_pico))"
    " AND (calls_limit IS NULL OR calls_used + 1 <= calls_limit)"
    " AND (tokens_limit IS NULL OR tokens_used + tokens_reserved + :tokens <= tokens_limit)"
)
# What the budget has left after the hold; NULL when it has no money limit.
LEFT = "limit_pico - spent_pico - reserved_pico"
HOLD_RETURNING = f"{HOLD} RETURNING {LEFT}"
BUDGET_LEFT = f"SELECT {LEFT} FROM budgets WHERE id = :id"
BUDGET_STATE = "SELECT limit_pico, reserved_pico, spent_pico, calls_limit, calls_used FROM budgets WHERE id = :id"
END_RESERVATION = (
    "UPDATE reservations SET state = :state, settled_pico = :charged, ended_at = :now WHERE id = :id AND state = 'reserved'"
)
MOVE_TO_SPENT = (
    "UPDATE budgets SET reserved_pico = reserved_pico - :amount, spent_pico = spent_pico + :charged,"
    " tokens_reserved = tokens_reserved - :tokens, tokens_used = tokens_used + :used, calls_used = calls_used - :unused"
    " WHERE id = :id"
)


RESERVATION_COLUMNS = list(reservations.columns)
INSERT_RESERVATION = insert_sql("reservations", [c.name for c in RESERVATION_COLUMNS])
# PostgreSQL, one round trip each. The reservation row is written only if the budget
# takes the hold, so a refusal writes nothing: the writer may then commit in the same
# round trip (accounting/writer.py) and hold the budget row's lock for no longer than the
# server takes. Typed casts: the values come from a SELECT, not a VALUES list.
@cache
def hold_and_record_sql() -> str:
    # Compiled on first use: importing the dialect is ~70 ms of start-up SQLite never needs.
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    return (
        f"WITH held AS ({HOLD.replace('WHERE id = :id', 'WHERE id = :budget_id')} RETURNING {LEFT} AS left_pico),"
        f" recorded AS (INSERT INTO reservations ({', '.join(c.name for c in RESERVATION_COLUMNS)})"
        f" SELECT {', '.join(f'CAST(:{c.name} AS {c.type.compile(dialect=dialect)})' for c in RESERVATION_COLUMNS)}"
        " FROM held RETURNING 1) SELECT left_pico FROM held"
    )


END_AND_SPEND = (f"WITH ended AS ({END_RESERVATION} RETURNING 1), spent AS ("
                 f"{MOVE_TO_SPENT.replace('WHERE id = :id', 'WHERE id = ANY(:budget_ids)')}"
                 " AND EXISTS (SELECT 1 FROM ended) RETURNING 1) SELECT count(*) FROM ended")
BOOKED = "SELECT 1 FROM usage_events WHERE request_id = :r AND attempt = :a AND kind = :k"
EVENT_COLUMNS = [c for c in usage_events.columns if c.name != "id"]
INSERT_EVENT = insert_sql("usage_events", [c.name for c in EVENT_COLUMNS])
# Columns an event may leave out (a cache hit has no replica, a tool call no route, ...):
# the table's own defaults, as a Core insert would fill them.
EVENT_DEFAULTS: dict[str, Any] = {c.name: c.default.arg if isinstance(c.default, ColumnDefault) and c.default.is_scalar else None
                                  for c in EVENT_COLUMNS}
ORPHAN_COLUMNS = ("id", "budget_ids", "amount_pico", "tokens", "request_id", "tenant", "key_id", "task_id", "model",
                  "upstream_model", "upstream", "endpoint", "prompt_tokens_est", "max_output_tokens", "created_at")
# What a model's calls with known usage looked like over the last week: the mean answer
# length, and the prompt tokens billed against the prompt sizes the gateway held for.
TYPICAL_CALL = ("SELECT avg(completion_tokens), sum(prompt_tokens), sum(prompt_tokens_est) FROM usage_events"
                " WHERE model = :model AND day >= :since AND kind = 'model' AND usage_known = :known")


@dataclass(frozen=True, slots=True)
class TypicalCall:
    """A model's recent calls, for estimating one whose usage is unknown."""

    output_tokens: int | None = None  # None: no call with known usage yet
    prompt_ratio: Fraction = Fraction(1)  # billed prompt tokens per prompt token held for

    def prompt_tokens(self, held_for: int) -> int:
        return math.ceil(held_for * min(Fraction(1), self.prompt_ratio))
ORPHANS = f"SELECT {', '.join(ORPHAN_COLUMNS)} FROM reservations WHERE state = 'reserved' AND expires_at < :now"
# What an expired hold's `unconfirmed` event copies from its reservation row.
ORPHAN_EVENT_FIELDS = ("request_id", "tenant", "key_id", "task_id", "endpoint", "model", "upstream_model", "upstream",
                       "prompt_tokens_est")
# The request id of a hold made ahead of demand by versions before every call had a hold
# of its own; such a hold may still be open in a ledger from before the upgrade.
AHEAD = "ahead_"
# PostgreSQL, the common settlement (one hold, one event) in one round trip.
BOOK_END_AND_SPEND = f"WITH booked AS ({INSERT_EVENT} RETURNING 1), {END_AND_SPEND.removeprefix('WITH ')}"


@dataclass(frozen=True, slots=True)
class HoldRequest:
    request_id: str
    tenant: str
    key_id: str
    task_id: str | None
    model: str
    upstream_model: str
    upstream: str
    endpoint: str
    amount_pico: int
    tokens: int
    prompt_tokens_est: int
    expires_at: datetime
    now: datetime
    sequence: int = 0
    max_output_tokens: int = 0
    # Hold only if each money-limited claim keeps at least this much left afterwards.
    margin_pico: int = 0


class _HoldRefused(WriteRefused):
    def __init__(self, claim: BudgetClaim, remaining_pico: int | None, calls_left: int | None) -> None:
        self.claim, self.remaining_pico, self.calls_left = claim, remaining_pico, calls_left


class Ledger:
    def __init__(self, writer: GroupCommitWriter) -> None:
        self.writer = writer

    async def reserve(self, request: HoldRequest, claims: list[BudgetClaim]) -> Hold:
        """Durably hold the worst-case cost against every claim, or refuse."""
        op, isolated, one = self._hold(request, claims)
        try:
            return await self.writer.run(op, isolated=isolated, staged=one)
        except _HoldRefused as refused:
            raise _budget_error(refused, request.amount_pico) from None
        except LedgerUnavailable as exc:
            # Nothing was sent upstream yet, so nothing is lost: say so, and let the client retry.
            raise NotReady(f"the ledger database is unreachable, so the budget cannot be held: {type(exc.__cause__ or exc).__name__}") from exc

    def _hold(self, request: HoldRequest, claims: list[BudgetClaim]) -> tuple[Callable[[DriverSql], Hold], bool, Staged[Hold] | None]:
        """The write that holds: (op, isolated, staged), as the writer takes them."""
        # One request may hold more than once (a retry or an escalation): number them.
        hold_id = f"rsv_{request.request_id.removeprefix('req_')}_{request.sequence}"

        row = dict(
            id=hold_id, request_id=request.request_id, tenant=request.tenant, key_id=request.key_id,
            task_id=request.task_id, model=request.model, upstream_model=request.upstream_model, upstream=request.upstream, endpoint=request.endpoint,
            budget_ids="\n".join(c.budget_id for c in claims), amount_pico=request.amount_pico, tokens=request.tokens,
            prompt_tokens_est=request.prompt_tokens_est, max_output_tokens=request.max_output_tokens, state="reserved",
            created_at=request.now,
            expires_at=request.expires_at, settled_pico=None, ended_at=None)

        def after_hold(sql: DriverSql, left: Row | None) -> Hold:
            """After hold_and_record_sql() on the one claim (PostgreSQL). Refused, it wrote
            nothing: then as below - create the budget row, or refuse."""
            if left is not None:
                return Hold(hold_id, request.amount_pico, request.tokens, (claims[0].budget_id,), left[0])
            return each_claim(sql)

        def each_claim(sql: DriverSql) -> Hold:
            left: list[int] = []
            for claim in claims:
                params = {"id": claim.budget_id, "amount": request.amount_pico, "tokens": request.tokens, "limit": claim.limit_pico,
                          "margin": request.margin_pico}
                held, claim_left = _hold(sql, params)
                if not held and sql.fetchone(BUDGET_STATE, {"id": claim.budget_id}) is None:
                    # The first hold on this budget (a new tenant, a new period): create it.
                    # Not up front on every hold - it is one statement per request saved.
                    sql.execute(ENSURE_BUDGET, {"id": claim.budget_id, "scope": claim.scope,
                                                "period_start": claim.period_start, "limit": claim.limit_pico})
                    held, claim_left = _hold(sql, params)
                if not held:
                    raise _refusal(sql, claim)
                if claim_left is not None:
                    left.append(claim_left)
            sql.execute(INSERT_RESERVATION, row)
            return Hold(hold_id, request.amount_pico, request.tokens, tuple(c.budget_id for c in claims), min(left, default=None))

        one = None
        if len(claims) == 1 and self.writer.one_trip:
            one = Staged(hold_and_record_sql(), {**row, "budget_id": claims[0].budget_id, "limit": claims[0].limit_pico,
                                           "amount": request.amount_pico, "margin": request.margin_pico}, after_hold,
                         more=_refused_or_new)

        def op(sql: DriverSql) -> Hold:
            return one.run(sql) if one is not None else each_claim(sql)

        # A refusal of the first claim has written nothing to undo (a budget row it
        # created may stay); only a later claim's refusal needs a savepoint.
        return op, len(claims) > 1, one

    async def settle(self, holds: list[Hold], charged_pico: int, tokens_used: int, events: list[dict[str, Any]],
                     now: datetime, *, skip_booked: bool = False) -> bool:
        """End the holds - charging `charged_pico` across them in order, releasing the
        rest - and book the events, in one transaction. Returns False if a hold had
        already ended (e.g. the sweeper expired it first)."""
        op, one = self._settlement(holds, charged_pico, tokens_used, events, now, skip_booked=skip_booked)
        return await self.writer.run(op, staged=one)

    def settle_later(self, holds: list[Hold], charged_pico: int, tokens_used: int, events: list[dict[str, Any]],
                     now: datetime) -> asyncio.Future[bool]:
        """`settle`, queued at once for a commit it may share with a later write (the
        ledger writer's linger); the future resolves as `settle` would return."""
        op, one = self._settlement(holds, charged_pico, tokens_used, events, now, skip_booked=False)
        return self.writer.submit(op, lazy=True, staged=one)

    def _settlement(self, holds: list[Hold], charged_pico: int, tokens_used: int, events: list[dict[str, Any]],
                    now: datetime, *, skip_booked: bool) -> tuple[Callable[[DriverSql], bool], Staged[bool] | None]:
        one = None
        if len(holds) == 1 and len(events) == 1 and not skip_booked and self.writer.one_trip:  # the common case
            params = _end_params(holds[0], charged_pico, tokens_used, "settled" if charged_pico else "released", now)
            one = Staged(BOOK_END_AND_SPEND, {**EVENT_DEFAULTS, **events[0], **params}, _ended)

        def op(sql: DriverSql) -> bool:
            if one is not None:
                return one.run(sql)
            ended = True
            cost, used = charged_pico, tokens_used
            for i, hold in enumerate(holds):
                last = i == len(holds) - 1  # whatever the earlier holds cannot take lands on the last
                charge = cost if last else min(cost, hold.amount_pico)
                take = used if last else min(used, hold.tokens)
                cost, used = cost - charge, used - take
                state = "settled" if charge else "released"
                ended &= _end(sql, hold, charge, take, state, now)
            # A replay skips events an earlier try already committed, so each stays single.
            events_left = [e for e in events if not (skip_booked and sql.exists(
                BOOKED, {"r": e["request_id"], "a": e["attempt"], "k": e.get("kind", "model")}))]
            if events_left:
                sql.executemany(INSERT_EVENT, [{**EVENT_DEFAULTS, **e} for e in events_left])
            return ended

        return op, one

    async def release_unused(self, holds: list[Hold], now: datetime, *, lazy: bool = True) -> None:
        """End holds made ahead of demand that no request drew on (spooled by versions
        before every call had a hold of its own): the money, the tokens and the call they
        counted go back to their budgets."""

        def op(sql: DriverSql) -> None:
            for hold in holds:
                _end(sql, hold, 0, 0, "released", now, unused=1)

        await self.writer.run(op, lazy=lazy)

    async def expire_orphans(self, now: datetime, estimate: OrphanEstimate | None = None) -> int:
        """End holds whose request never settled (its replica died, or lost the call)
        once past their expiry - their request's deadline plus a grace. Each is charged
        `estimate`'s figure for what the call most likely cost (its worst case when no
        estimate is given, or the model is no longer known) and gets an `unconfirmed`
        event marked estimated, which reconciliation corrects against the provider."""

        def find(sql: DriverSql) -> tuple[list[dict[str, Any]], dict[str, TypicalCall]]:
            rows = [dict(zip(ORPHAN_COLUMNS, r, strict=True)) for r in sql.fetchall(ORPHANS, {"now": now})]
            since = (now - timedelta(days=7)).date().isoformat()
            typical: dict[str, TypicalCall] = {}
            for model in {row["model"] for row in rows}:
                found = sql.fetchone(TYPICAL_CALL, {"model": model, "since": since, "known": True})
                if found is None or found[0] is None:
                    typical[model] = TypicalCall()
                else:
                    billed, held_for = int(found[1] or 0), int(found[2] or 0)
                    typical[model] = TypicalCall(round(found[0]), Fraction(billed, held_for) if held_for else Fraction(1))
            return rows, typical

        rows, typical = await self.writer.run(find)
        if not rows:
            return 0
        priced = [(row, estimate(row, typical[row["model"]]) if estimate is not None else None) for row in rows]

        def op(sql: DriverSql) -> int:
            ended = 0
            for row, guess in priced:
                hold = Hold(row["id"], row["amount_pico"], row["tokens"], tuple(b for b in row["budget_ids"].split("\n") if b))
                cost, usage, reason = guess if guess is not None else (row["amount_pico"], None, _worst_case_reason(row["request_id"]))
                if not _end(sql, hold, cost, 0, "expired", now):
                    continue  # settled meanwhile
                ended += 1
                created = as_datetime(row["created_at"])
                tokens = {"prompt_tokens": usage[0], "completion_tokens": usage[1]} if usage is not None else {}
                sql.execute(INSERT_EVENT, {**EVENT_DEFAULTS, **{k: row[k] for k in ORPHAN_EVENT_FIELDS}, **tokens, **dict(
                    attempt=0, reservation_id=row["id"], kind="model", status="unconfirmed", usage_known=False,
                    estimated=usage is not None, cost_pico=cost, created_at=created, day=created.date().isoformat(),
                    error=reason)})
            return ended

        return int(await self.writer.run(op))


# (the orphan's reservation row, its model's recent calls) ->
# (cost to charge, (prompt, completion) tokens it stands for, the reason booked with it)
OrphanEstimate = Callable[[dict[str, Any], TypicalCall], tuple[int, tuple[int, int] | None, str]]


def _worst_case_reason(request_id: str) -> str:
    if request_id.startswith(AHEAD):
        return ("held ahead of demand and still open when the gateway stopped; a call may have drawn on it and no usage "
                "was confirmed before the reservation expired, so it was charged the reserved worst case")
    return "no usage was confirmed before the reservation expired; charged the reserved worst case"


def _end_params(hold: Hold, charged: int, used: int, state: str, now: datetime, unused: int = 0) -> dict[str, Any]:
    return {"state": state, "charged": charged, "now": now, "id": hold.id, "budget_ids": list(hold.budget_ids),
            "amount": hold.amount_pico, "tokens": hold.tokens, "used": used, "unused": unused}


def _refused_or_new(row: Row | None) -> bool:
    """Whether a hold's one statement left more to do: the budget did not take it (full,
    or its row not created yet)."""
    return row is None


def _ended(sql: DriverSql, row: Row | None) -> bool:
    return row is not None and row[0] == 1


def _end(sql: DriverSql, hold: Hold, charged: int, used: int, state: str, now: datetime, unused: int = 0) -> bool:
    params = _end_params(hold, charged, used, state, now, unused)
    if sql.one_trip:
        return _ended(sql, sql.fetchone(END_AND_SPEND, params))
    if sql.execute(END_RESERVATION, params) != 1:
        return False
    for budget_id in hold.budget_ids:
        sql.execute(MOVE_TO_SPENT, {**params, "id": budget_id})
    return True


def _hold(sql: DriverSql, params: dict[str, Any]) -> tuple[bool, int | None]:
    """The hold on one budget, and what that budget has left after it."""
    if sql.returning:
        row = sql.fetchone(HOLD_RETURNING, params)
        return (False, None) if row is None else (True, row[0])
    if sql.execute(HOLD, params) != 1:
        return False, None
    left = sql.fetchone(BUDGET_LEFT, {"id": params["id"]})
    return True, None if left is None else left[0]


def _refusal(sql: DriverSql, claim: BudgetClaim) -> _HoldRefused:
    row = sql.fetchone(BUDGET_STATE, {"id": claim.budget_id})
    assert row is not None  # ensured in this same transaction
    limit_pico, reserved_pico, spent_pico, calls_limit, calls_used = row
    limit = claim.limit_pico if claim.limit_pico is not None else limit_pico
    remaining = None if limit is None else max(0, limit - reserved_pico - spent_pico)
    calls_left = None if calls_limit is None else max(0, calls_limit - calls_used)
    return _HoldRefused(claim, remaining, calls_left)


def _budget_error(refused: _HoldRefused, amount_pico: int) -> BudgetExceeded:
    from gateway.accounting.money import usd

    what = refused.claim.label
    if refused.calls_left == 0:
        return BudgetExceeded(f"{what} has no calls left")
    if refused.remaining_pico is not None and refused.remaining_pico < amount_pico:
        return BudgetExceeded(
            f"{what} has ${usd(refused.remaining_pico)} left (including amounts held for requests in flight); "
            f"this request may cost up to ${usd(amount_pico)}. Lower max_tokens or raise the budget."
        )
    return BudgetExceeded(f"{what} has no tokens left for a request of this size")


def as_datetime(value: Any) -> datetime:
    """A timestamp as the driver returns it (SQLite: naive, or text), in UTC."""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)  # SQLite hands back naive UTC


def expiry(deadline_s: float, now: datetime, grace_s: float) -> datetime:
    return now + timedelta(seconds=deadline_s + grace_s)
