"""Reconciliation: the ledger against what a provider says it billed, with a reason for
every difference.

Both sides are summed per (UTC day, the model name the provider bills under, the
provider's id for the upstream's key). The ledger side counts attempts whose usage is
known (tokens, requests) and every attempt's cost; attempts whose usage never arrived
are counted by why, because they are what usually explains the provider billing more:

- `unconfirmed`: the reservation expired with no usage; the ledger charged its worst case.
- `pending`: the usage is unknown and the reservation is still held.
- `cancelled`: the client went away, the deadline passed or the stream was cut; the
  ledger booked an estimate (the prompt plus the output relayed), the provider bills
  what it generated: the difference is the estimate's error.
- `retried`: a failed attempt of a request that was tried again; providers may count it.

A positive request difference is explained by those attempts first, in that order, and
what they cannot explain is `missing at gateway`; usage the provider lacks is `missing
at provider`. Token differences follow the requests (split by request share, an
estimate: reports carry totals, not requests), they are priced at the gateway's own
price, and any cost left over beyond a tolerance is `price drift`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time

from sqlalchemy import Engine, Integer, case, distinct, func, literal_column, select
from sqlalchemy.sql.expression import ColumnElement, FromClause

from gateway.accounting.price_sources import LitellmMap
from gateway.accounting.prices import PriceCatalog, PriceQuote
from gateway.accounting.reconcile_explain import (
    CANCELLED,
    MISSING_AT_GATEWAY,
    MISSING_AT_PROVIDER,
    PENDING,
    PRICE_DRIFT,
    REASONS,
    RETRIED,
    UNCONFIRMED,
    Amounts,
    Explanation,
    LedgerGroup,
    cost_at,
    explain,
)
from gateway.accounting.reconcile_report import (
    DEFAULT_COST_TOLERANCE_PICO,
    MATCHED,
    ReconciliationReport,
    ReconciliationRow,
    Window,
)
from gateway.accounting.tables import reservations, usage_events
from gateway.routing.policy import Policy

# The reasons and amounts are defined in reconcile_explain.py, the report in
# reconcile_report.py; callers take them from here.
__all__ = [
    "CANCELLED", "DEFAULT_COST_TOLERANCE_PICO", "MATCHED", "MISSING_AT_GATEWAY", "MISSING_AT_PROVIDER", "PENDING",
    "PRICE_DRIFT", "REASONS", "RETRIED", "UNCONFIRMED", "Amounts", "Explanation", "ImportFailed", "ProgressCallback",
    "ProviderUsage", "ReconciliationReport", "ReconciliationRow", "Window", "aggregate_ledger", "merge_rows", "reconcile",
]

CUT_SHORT = frozenset({"cancelled", "timeout", "cut"})
_SNAPSHOT = re.compile(r"^(.+)-(\d{4}-\d{2}-\d{2}|\d{4})$")  # gpt-4o-mini-2024-07-18, gpt-4-0613

EVENTS = usage_events
HOLDS = reservations
Group = tuple[date, str, str | None]

ProgressCallback = Callable[[int, str], None]
"""`on_progress(done_pages, note)`: called after each page or step an import finishes."""


class ImportFailed(Exception):
    """A provider report could not be read or made no sense; the message says which and why."""


@dataclass(frozen=True, slots=True)
class ProviderUsage:
    """What a provider billed for one (UTC day, model, key), as an importer read it.

    Tokens follow OpenAI's convention: `input_tokens` includes cached and cache-write
    tokens. A field a source does not report is None (Anthropic's usage report has no
    request count; a vLLM scrape has no cached tokens and no cost; only Anthropic's
    reports name cache writes, and of them the 1-hour ones) and is not compared.
    """

    day: date
    model: str
    key_id: str | None
    input_tokens: int
    cached_tokens: int | None
    output_tokens: int
    requests: int | None
    cost_pico: int | None
    source: str
    cache_write_tokens: int | None = None  # every cache write, the 1-hour ones included
    cache_write_1h_tokens: int | None = None

    @property
    def group(self) -> Group:
        return (self.day, self.model, self.key_id)


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None and b is None else (a or 0) + (b or 0)


def merge_rows(rows: Iterable[ProviderUsage]) -> list[ProviderUsage]:
    """One row per (day, model, key): reports split a group across buckets, pages,
    service tiers or line items, and the comparison needs it whole."""
    merged: dict[Group, ProviderUsage] = {}
    for row in rows:
        seen = merged.get(row.group)
        merged[row.group] = row if seen is None else replace(
            seen,
            input_tokens=seen.input_tokens + row.input_tokens,
            cached_tokens=_add(seen.cached_tokens, row.cached_tokens),
            output_tokens=seen.output_tokens + row.output_tokens,
            requests=_add(seen.requests, row.requests),
            cost_pico=_add(seen.cost_pico, row.cost_pico),
            cache_write_tokens=_add(seen.cache_write_tokens, row.cache_write_tokens),
            cache_write_1h_tokens=_add(seen.cache_write_1h_tokens, row.cache_write_1h_tokens),
        )
    return sorted(merged.values(), key=lambda r: (r.day, r.model, r.key_id or ""))


def reconcile(
    engine: Engine,
    policy: Policy,
    upstream_name: str,
    provider_rows: Iterable[ProviderUsage],
    since: date | datetime,
    until: date | datetime,
    *,
    catalog: PriceCatalog | None = None,
    source: str | None = None,
    cost_tolerance_pico: int = DEFAULT_COST_TOLERANCE_PICO,
) -> ReconciliationReport:
    """Compare the ledger's usage on `upstream_name` over [since, until) with
    `provider_rows`. Dates mean whole UTC days; datetimes one window (see `Window`).
    Without a catalog, token differences are priced with the policy's prices only."""
    if upstream_name not in policy.upstreams:
        raise ValueError(f"no upstream `{upstream_name}` in the policy (it has: {', '.join(sorted(policy.upstreams))})")
    window = Window.of(since, until)
    rows = list(provider_rows)
    notes: list[str] = []
    key_id = policy.upstreams[upstream_name].provider_key_id
    provider, key_id = _provider_side(rows, window, key_id, notes)
    ledger = aggregate_ledger(engine, upstream_name, window, key_id)
    provider = _align_models(provider, {model for _, model, _ in ledger}, notes)
    pricer = _Pricer(policy, upstream_name, catalog or PriceCatalog([], LitellmMap({}), "policy prices"))
    compared = [
        _compare(group, ledger.get(group), provider.get(group), pricer.quote(group[1], group[0]), cost_tolerance_pico)
        for group in sorted(ledger.keys() | provider.keys(), key=lambda g: (g[0], g[1], g[2] or ""))
    ]
    label = source or ", ".join(sorted({r.source for r in rows})) or "no provider rows"
    return ReconciliationReport(upstream_name, label, window, tuple(compared), tuple(notes), cost_tolerance_pico)


def aggregate_ledger(engine: Engine, upstream: str, window: Window, key_id: str | None) -> dict[Group, LedgerGroup]:
    """The ledger's model attempts on `upstream` in the window, per (day, upstream model)."""
    e, m, u, h = EVENTS.alias("e"), EVENTS.alias("m"), EVENTS.alias("u"), HOLDS.alias("h")
    # Requests with more than one real attempt (retries, failovers to another upstream).
    multi = (select(m.c.request_id).where(m.c.kind == "model", m.c.attempt > 0, *_in_window(m, window))
             .group_by(m.c.request_id).having(func.count(distinct(m.c.attempt)) > 1).subquery("multi"))
    # Reservations whose unknown-usage attempts are booked: their later `unconfirmed`
    # row adds the worst-case charge, not another request the provider might bill.
    covered = (select(u.c.reservation_id).where(u.c.kind == "model", u.c.attempt > 0, u.c.usage_known.is_(False),
                                                u.c.reservation_id.is_not(None), *_in_window(u, window))
               .distinct().subquery("covered"))
    # Literal columns, not bound parameters: PostgreSQL must see GROUP BY and SELECT agree.
    one, zero = literal_column("1", Integer), literal_column("0", Integer)
    is_multi = case((multi.c.request_id.is_not(None), one), else_=zero)
    is_covered = case((covered.c.reservation_id.is_not(None), one), else_=zero)
    dims = (e.c.day, e.c.upstream_model, e.c.status, e.c.usage_known, h.c.state, is_multi, is_covered)
    query = (
        select(*dims, func.count(), func.sum(e.c.prompt_tokens), func.sum(e.c.cached_tokens),
               func.sum(e.c.completion_tokens), func.sum(e.c.cost_pico), func.sum(e.c.cache_write_tokens),
               func.sum(e.c.cache_write_1h_tokens))
        .select_from(e.outerjoin(h, h.c.id == e.c.reservation_id)
                     .outerjoin(multi, multi.c.request_id == e.c.request_id)
                     .outerjoin(covered, covered.c.reservation_id == e.c.reservation_id))
        .where(e.c.kind == "model", e.c.upstream == upstream, *_in_window(e, window))
        .group_by(*dims)
    )
    groups: dict[Group, LedgerGroup] = {}
    with engine.connect() as conn:
        for day, model, status, known, hold, retried, covers, n, prompt, cached, completion, cost, writes, hour_writes in conn.execute(query):
            group = groups.setdefault((window.day_of(date.fromisoformat(day)), model, key_id), LedgerGroup())
            category = _category(status, bool(known), hold, bool(retried))
            group.attempts[category] += n
            if category == "booked":
                group.usage += Amounts(n, int(prompt or 0), int(cached or 0), int(completion or 0), 0,
                                       int(writes or 0), int(hour_writes or 0))
            group.usage += Amounts(cost_pico=int(cost or 0))
            if category == UNCONFIRMED:
                group.unconfirmed_cost_pico += int(cost or 0)
                group.unconfirmed_covered += n if covers else 0
            elif category == CANCELLED:
                group.estimated_cost_pico += int(cost or 0)
    return groups


def _category(status: str, usage_known: bool, hold_state: str | None, retried: bool) -> str:
    if usage_known:
        return "booked"
    if status == UNCONFIRMED:
        return UNCONFIRMED
    if hold_state == "reserved" or status == "pending":
        return PENDING
    if status in CUT_SHORT:
        return CANCELLED
    return RETRIED if retried else "failed"


def _in_window(t: FromClause, window: Window) -> list[ColumnElement[bool]]:
    first, last = window.start.date().isoformat(), window.end.date().isoformat()
    if window.whole_days:
        return [t.c.day >= first, t.c.day < last]
    # The day bounds let the (day, ...) index narrow the scan.
    return [t.c.day >= first, t.c.day <= last, t.c.created_at >= window.start, t.c.created_at < window.end]


def _provider_side(rows: list[ProviderUsage], window: Window, key_id: str | None,
                   notes: list[str]) -> tuple[dict[Group, ProviderUsage], str | None]:
    """Rows in the window, restricted to the upstream's key when both sides know keys;
    returns them by group and the key id both sides are compared under."""
    rows = [replace(r, day=window.day_of(r.day)) for r in rows if window.covers(r.day)]
    keys = {r.key_id for r in rows}
    if key_id is not None and None not in keys:
        others = [r for r in rows if r.key_id != key_id]
        if others:
            tokens = sum(r.input_tokens + r.output_tokens for r in others)
            notes.append(f"left out {tokens} tokens billed to other keys ({', '.join(sorted({str(r.key_id) for r in others}))}): "
                         f"not this upstream's key {key_id}")
        rows = [r for r in rows if r.key_id == key_id]
    else:
        if key_id is None and keys - {None}:
            notes.append("the upstream has no `provider_key_id`, so usage of every key the provider reports "
                         f"({', '.join(sorted(str(k) for k in keys - {None}))}) is compared with it; set it to compare one key")
        elif key_id is not None:
            notes.append("the provider's report is not grouped by key; all of it is compared with this upstream")
        key_id = None
        rows = [replace(r, key_id=None) for r in rows]
    return {r.group: r for r in merge_rows(rows)}, key_id


def _align_models(provider: dict[Group, ProviderUsage], ledger_models: set[str], notes: list[str]) -> dict[Group, ProviderUsage]:
    """Providers report the dated snapshot that served a request (`gpt-4o-mini-2024-07-18`)
    where the gateway asked for the alias (`gpt-4o-mini`); compare them as the alias."""
    rows = []
    for row in provider.values():
        match = _SNAPSHOT.match(row.model)
        if row.model not in ledger_models and match is not None and match.group(1) in ledger_models:
            notes.append(f"provider model {row.model} on {row.day} compared as {match.group(1)}, the name the gateway sent")
            row = replace(row, model=match.group(1))
        rows.append(row)
    return {r.group: r for r in merge_rows(rows)}


class _Pricer:
    """The gateway's own price for a billed model name on a day: prices token differences."""

    def __init__(self, policy: Policy, upstream: str, catalog: PriceCatalog) -> None:
        self.catalog = catalog
        self.models = [(name, m) for name, m in policy.models.items() if m.upstream == upstream]

    def quote(self, billed_model: str, day: date) -> PriceQuote | None:
        at = datetime.combine(day, time(12), tzinfo=UTC)
        for name, model in self.models:
            if (model.upstream_model or name) == billed_model:
                found = self.catalog.quote(name, model.upstream_model, model.price, at)
                if found is not None:
                    return found
        return self.catalog.quote(billed_model, None, None, at)


def _compare(group: Group, ledger: LedgerGroup | None, provider: ProviderUsage | None,
             quote: PriceQuote | None, tolerance: int) -> ReconciliationRow:
    booked = ledger.usage if ledger is not None else Amounts()
    # Cost booked with no usage reported (worst cases, estimates): the provider's tokens replace it.
    unconfirmed_cost = (ledger.unconfirmed_cost_pico + ledger.estimated_cost_pico) if ledger is not None else 0
    billed, not_reported = Amounts(), []
    if provider is not None:
        # What a source does not report is taken as equal to the ledger: not compared.
        cached = booked.cached_tokens if provider.cached_tokens is None else provider.cached_tokens
        requests = booked.requests if provider.requests is None else provider.requests
        writes = booked.cache_write_tokens if provider.cache_write_tokens is None else provider.cache_write_tokens
        hour_writes = booked.cache_write_1h_tokens if provider.cache_write_1h_tokens is None else provider.cache_write_1h_tokens
        billed = Amounts(requests, provider.input_tokens, cached, provider.output_tokens, 0, writes, hour_writes)
        not_reported = [name for name, value in (("cached_tokens", provider.cached_tokens), ("requests", provider.requests),
                                                 ("cost", provider.cost_pico)) if value is None]
        if provider.cost_pico is None:
            # No cost from the source: its tokens at the gateway's price, so cost shows the
            # money side of token differences and price drift cannot arise.
            priced = cost_at(quote, billed - replace(booked, cost_pico=0)) if quote is not None else 0
            billed = replace(billed, cost_pico=booked.cost_pico - unconfirmed_cost + priced)
        else:
            billed = replace(billed, cost_pico=provider.cost_pico)
    explanations = explain(billed - booked, ledger, provider is not None, quote, tolerance)
    return ReconciliationRow(group[0], group[1], group[2], booked, billed, explanations,
                             dict(ledger.attempts) if ledger is not None else {}, ledger is not None, provider is not None,
                             tuple(not_reported), provider is not None and provider.cost_pico is None)

