"""OpenAI's organization Usage API (completions and embeddings) and Costs API, read
into `ProviderUsage` rows per (UTC day, model, api key id).

Both APIs answer in pages of daily buckets (`bucket_width=1d`); we follow `next_page`
until `has_more` is false. The usage API has one endpoint per kind of call, so both
completions and embeddings are read: the ledger books both under the same upstream.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from math import ceil
from typing import Any, Protocol

from gateway.accounting.money import PICO_PER_USD
from gateway.accounting.reconcile import ImportFailed, ProgressCallback, ProviderUsage, merge_rows

QueryValue = str | int | list[str]  # a list is sent as the parameter repeated


class FetchJson(Protocol):
    """GET `url` with query `params`; the decoded JSON object. Raises on HTTP errors.
    `gateway.upstreams.provider_reports.ProviderReportClient.json` is the real one."""

    def __call__(self, url: str, params: Mapping[str, QueryValue]) -> dict[str, Any]: ...


USAGE_KINDS = ("completions", "embeddings")
USAGE_DAYS_PER_PAGE = 31  # the API's maximum for bucket_width=1d
COSTS_DAYS_PER_PAGE = 180

Group = tuple[date, str, str | None]


def expected_pages(since: date, until: date, with_costs: bool = True) -> int:
    """A guess for the progress bar: pages come back fuller or emptier than this."""
    days = max((until - since).days, 1)
    usage = len(USAGE_KINDS) * ceil(days / USAGE_DAYS_PER_PAGE)
    return usage + (ceil(days / COSTS_DAYS_PER_PAGE) if with_costs else 0)


def import_openai_usage(
    fetch: FetchJson,
    base_url: str,
    since: date,
    until: date,
    *,
    with_costs: bool = True,
    on_progress: ProgressCallback | None = None,
    source: str = "openai usage API",
) -> list[ProviderUsage]:
    """Usage over the UTC days [since, until), with the Costs API's amounts merged in
    when `with_costs` (otherwise `cost_pico` is None and reconciliation prices tokens
    at the gateway's own prices). `base_url` is the upstream's, ending in `/v1`."""
    base = base_url.rstrip("/")
    pager = _Pager(fetch, on_progress)
    window: dict[str, QueryValue] = {"start_time": _unix(since), "end_time": _unix(until), "bucket_width": "1d"}
    rows: list[ProviderUsage] = []
    for kind in USAGE_KINDS:
        params = {**window, "group_by": "model,api_key_id", "limit": USAGE_DAYS_PER_PAGE}
        for day, result in pager.results(f"{base}/organization/usage/{kind}", params, f"usage/{kind}"):
            rows.append(_usage_row(day, result, kind, source))
    rows = merge_rows(rows)
    if not with_costs:
        return rows
    params = {**window, "group_by": "line_item,api_key_id", "limit": COSTS_DAYS_PER_PAGE}
    costs: dict[Group, int] = {}
    for day, result in pager.results(f"{base}/organization/costs", params, "costs"):
        group = (day, line_item_model(result.get("line_item")), _optional_str(result, "api_key_id"))
        costs[group] = costs.get(group, 0) + _amount_pico(result)
    return _with_costs(rows, costs, source)


class _Pager:
    """Follows `next_page` across calls and counts pages for the progress callback."""

    def __init__(self, fetch: FetchJson, on_progress: ProgressCallback | None) -> None:
        self.fetch = fetch
        self.on_progress = on_progress
        self.done = 0

    def results(self, url: str, params: Mapping[str, QueryValue], what: str) -> Iterator[tuple[date, dict[str, Any]]]:
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            query = dict(params) if cursor is None else {**params, "page": cursor}
            page = self.fetch(url, query)
            if not isinstance(page.get("data"), list):
                raise ImportFailed(f"{what}: the page has no `data` list")
            for bucket in page["data"]:
                day = _bucket_day(bucket, what)
                for result in bucket.get("results") or []:
                    if not isinstance(result, dict):
                        raise ImportFailed(f"{what}: a result in the bucket for {day} is not an object")
                    yield day, result
            self.done += 1
            if self.on_progress is not None:
                self.on_progress(self.done, f"{what} page {len(seen) + 1}")
            if not page.get("has_more"):
                return
            cursor = page.get("next_page")
            # A cursor that repeats would page forever and count buckets twice.
            if not isinstance(cursor, str) or not cursor or cursor in seen:
                raise ImportFailed(f"{what}: `has_more` is true but `next_page` is missing or repeats ({cursor!r})")
            seen.add(cursor)


def _usage_row(day: date, result: Mapping[str, Any], kind: str, source: str) -> ProviderUsage:
    model = _optional_str(result, "model")
    if model is None:
        raise ImportFailed(f"usage/{kind}: a result for {day} has no `model`; the report must be grouped by model")
    embeddings = kind == "embeddings"
    return ProviderUsage(
        day=day,
        model=model,
        key_id=_optional_str(result, "api_key_id"),
        input_tokens=_count(result, "input_tokens"),
        # Embeddings have no cache and no output; completions always report cached input.
        cached_tokens=0 if embeddings else _count(result, "input_cached_tokens", optional=True),
        output_tokens=0 if embeddings else _count(result, "output_tokens"),
        requests=_count(result, "num_model_requests"),
        cost_pico=None,
        source=source,
    )


def _with_costs(rows: list[ProviderUsage], costs: dict[Group, int], source: str) -> list[ProviderUsage]:
    # Once the Costs API is read, a usage group it has no amount for cost nothing.
    priced = [replace(row, cost_pico=costs.pop(row.group, 0)) for row in rows]
    # An amount with no usage behind it is billed all the same (e.g. a line item the
    # usage report does not cover), so it becomes a row of its own.
    extra = [ProviderUsage(day, model, key, 0, 0, 0, 0, cost, source) for (day, model, key), cost in costs.items()]
    return merge_rows([*priced, *extra])


def line_item_model(line_item: Any) -> str:
    """`gpt-4o-mini-2024-07-18, input` -> `gpt-4o-mini-2024-07-18`: OpenAI splits a
    model's cost into input/output line items; reconciliation compares per model."""
    if not isinstance(line_item, str) or not line_item.strip():
        return "(no line item)"
    return line_item.split(",", 1)[0].strip()


def _amount_pico(result: Mapping[str, Any]) -> int:
    amount = result.get("amount")
    if not isinstance(amount, dict):
        raise ImportFailed("costs: a result has no `amount`")
    currency = str(amount.get("currency", "usd")).lower()
    if currency != "usd":
        raise ImportFailed(f"costs: amount in {currency!r}; the ledger counts USD only")
    try:
        # Through str(): the float's shortest repr, not its binary expansion.
        value = Decimal(str(amount.get("value", 0)))
    except InvalidOperation:
        raise ImportFailed(f"costs: amount {amount.get('value')!r} is not a number") from None
    return int((value * PICO_PER_USD).to_integral_value())


def _count(result: Mapping[str, Any], name: str, optional: bool = False) -> int:
    value = result.get(name)
    if value is None and optional:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ImportFailed(f"`{name}` should be a non-negative integer, got {value!r}")
    return value


def _optional_str(result: Mapping[str, Any], name: str) -> str | None:
    value = result.get(name)
    return value if isinstance(value, str) and value else None


def _bucket_day(bucket: Any, what: str) -> date:
    start = bucket.get("start_time") if isinstance(bucket, dict) else None
    if isinstance(start, bool) or not isinstance(start, int):
        raise ImportFailed(f"{what}: a bucket has no integer `start_time`")
    return datetime.fromtimestamp(start, UTC).date()


def _unix(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())
