"""Anthropic's live Admin API, read into `ProviderUsage` rows per (UTC day, model, api key):
the Messages usage report for tokens and the cost report for money.

The cost report (`GET /v1/organizations/cost_report`, grouped by `description`) gives
each day's cost per model and token type as a decimal string in cents, but has no api
key. A (day, model) used by one key gets its cost whole. Used by several keys, each
token type's cost is shared by the keys' tokens of that type - exact up to a pico-dollar
a share while every key pays the same rate - and a note says so. Costs with no token
type (web search, code execution) are shared by all tokens.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import replace
from datetime import date
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from gateway.accounting.importers.anthropic_usage import (
    bucket_day,
    report_pages,
    result_row,
    token_count,
    usage_pages,
    window_params,
)
from gateway.accounting.importers.openai_usage import FetchJson, QueryValue
from gateway.accounting.reconcile import ImportFailed, ProgressCallback, ProviderUsage, merge_rows

SOURCE = "anthropic admin API"
PICO_PER_CENT = 10**10
COST_DAYS_PER_PAGE = 31
# The cost report's `token_type`s, named as the usage report's fields.
TOKEN_TYPES = ("uncached_input_tokens", "cache_read_input_tokens", "cache_creation.ephemeral_5m_input_tokens",
               "cache_creation.ephemeral_1h_input_tokens", "output_tokens")
OTHER = "(other)"  # a cost with no token type

Group = tuple[date, str, str | None]
DayModel = tuple[date, str]


def import_anthropic_admin(fetch: FetchJson, base_url: str, since: date, until: date, *,
                           on_progress: ProgressCallback | None = None) -> tuple[list[ProviderUsage], list[str]]:
    """Usage and cost over the UTC days [since, until), and notes on how cost was split.
    `base_url` is the API root ending in `/v1`."""
    rows: list[ProviderUsage] = []
    tokens: dict[Group, Counter[str]] = defaultdict(Counter)
    pages = 0
    for page in usage_pages(fetch, base_url, since, until, on_progress):
        pages += 1
        for day, result in _results(page, "usage_report/messages"):
            row = result_row(day, result, SOURCE)
            rows.append(row)
            tokens[row.group].update(token_types(result))
    costs = read_costs(fetch, base_url, since, until, on_progress, pages)
    usage = [r for r in merge_rows(rows) if since <= r.day < until]
    return attach_costs(usage, {g: c for g, c in tokens.items() if since <= g[0] < until}, costs)


def token_types(result: Mapping[str, Any]) -> dict[str, int]:
    """One usage result's tokens under the cost report's token type names."""
    creation = result.get("cache_creation") or {}
    if not isinstance(creation, dict):
        raise ImportFailed(f"{SOURCE}: `cache_creation` is not an object")
    counts = {name: token_count(result, name, SOURCE) for name in ("uncached_input_tokens", "cache_read_input_tokens", "output_tokens")}
    for ttl in ("5m", "1h"):
        counts[f"cache_creation.ephemeral_{ttl}_input_tokens"] = token_count(creation, f"ephemeral_{ttl}_input_tokens", SOURCE)
    return counts


def read_costs(fetch: FetchJson, base_url: str, since: date, until: date,
               on_progress: ProgressCallback | None = None, pages_before: int = 0) -> dict[DayModel, dict[str, Decimal]]:
    """The cost report's cents per (day, model) and token type, summed exactly."""
    params: dict[str, QueryValue] = {**window_params(since, until), "group_by[]": ["description"], "limit": COST_DAYS_PER_PAGE}
    url = base_url.rstrip("/") + "/organizations/cost_report"
    costs: dict[DayModel, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    for page in report_pages(fetch, url, params, on_progress, pages_before):
        for day, result in _results(page, "cost_report"):
            if since <= day < until:
                model = result.get("model")
                token_type = result.get("token_type")
                line = costs[(day, model if isinstance(model, str) and model else "(no model)")]
                line[token_type if token_type in TOKEN_TYPES else OTHER] += cents(result)
    return costs


def cents(result: Mapping[str, Any]) -> Decimal:
    """A cost result's `amount` (a decimal string in cents), exactly."""
    currency = str(result.get("currency") or "USD").upper()
    if currency != "USD":
        raise ImportFailed(f"cost_report: amount in {currency}; the ledger counts USD only")
    amount = result.get("amount")
    if not isinstance(amount, str):
        # A float would already have lost digits; the API sends a string.
        raise ImportFailed(f"cost_report: `amount` should be a decimal string in cents, got {amount!r}")
    try:
        value = Decimal(amount)
    except InvalidOperation:
        raise ImportFailed(f"cost_report: `amount` {amount!r} is not a decimal number") from None
    if not value.is_finite():
        raise ImportFailed(f"cost_report: `amount` {amount!r} is not a finite number")
    return value


def cents_to_pico(value: Decimal) -> int:
    """1 cent = 10**10 pico-dollars; a fraction of a pico-dollar rounds half to even."""
    return int((value * PICO_PER_CENT).to_integral_value())


def attach_costs(usage: list[ProviderUsage], tokens: Mapping[Group, Counter[str]],
                 costs: Mapping[DayModel, Mapping[str, Decimal]]) -> tuple[list[ProviderUsage], list[str]]:
    """Each usage row with its share of its (day, model)'s cost (0 when the cost report
    has none: nothing was billed); a cost with no usage behind it becomes a row of its own."""
    notes: list[str] = []
    by_day_model: dict[DayModel, list[ProviderUsage]] = defaultdict(list)
    for row in usage:
        by_day_model[(row.day, row.model)].append(row)
    keyed = any(row.key_id is not None for row in usage)
    out: list[ProviderUsage] = []
    for (day, model), group in by_day_model.items():
        lines = costs.get((day, model), {})
        if len(group) == 1:
            out.append(replace(group[0], cost_pico=cents_to_pico(sum(lines.values(), Decimal(0)))))
            continue
        shares = _split(lines, [tokens.get(row.group, Counter()) for row in group])
        out.extend(replace(row, cost_pico=share) for row, share in zip(group, shares, strict=True))
        if lines:
            notes.append(f"{model} on {day}: the cost report has no api key, so its cost is shared among "
                         f"{len(group)} keys by their tokens of each type")
    for (day, model), lines in costs.items():
        if (day, model) in by_day_model:
            continue
        pico = cents_to_pico(sum(lines.values(), Decimal(0)))
        if keyed:
            notes.append(f"{model} on {day}: ${Decimal(pico) / 10**12} in the cost report with no usage behind it, "
                         "so no api key to compare it with: left out")
        else:
            out.append(ProviderUsage(day, model, None, 0, 0, 0, None, pico, SOURCE))
    return merge_rows(out), notes


def _split(lines: Mapping[str, Decimal], counts: list[Counter[str]]) -> list[int]:
    """Each token type's pico-dollars shared by `counts` of that type, largest remainder
    first, so the shares add up to the whole exactly."""
    totals = [0] * len(counts)
    for token_type, amount in lines.items():
        weights = [sum(c.values()) if token_type == OTHER else c[token_type] for c in counts]
        if sum(weights) == 0:
            weights = [sum(c.values()) for c in counts]  # billed a type the report shows no tokens of
        if sum(weights) == 0:
            weights = [1] * len(counts)
        whole = cents_to_pico(amount)
        exact = [Fraction(whole * w, sum(weights)) for w in weights]
        shares = [math.floor(e) for e in exact]  # never above the exact share, so the remainder is >= 0
        for i in sorted(range(len(exact)), key=lambda i: exact[i] - shares[i], reverse=True)[:whole - sum(shares)]:
            shares[i] += 1
        totals = [t + s for t, s in zip(totals, shares, strict=True)]
    return totals


def _results(page: Mapping[str, Any], what: str) -> list[tuple[date, dict[str, Any]]]:
    data = page.get("data")
    if not isinstance(data, list):
        raise ImportFailed(f"{what}: the page has no `data` list")
    out = []
    for bucket in data:
        if not isinstance(bucket, dict):
            raise ImportFailed(f"{what}: a bucket is not an object")
        day = bucket_day(bucket.get("starting_at"), what)
        for result in bucket.get("results") or []:
            if not isinstance(result, dict):
                raise ImportFailed(f"{what}: a result for {day} is not an object")
            out.append((day, result))
    return out
