"""Anthropic's Messages usage report (`GET /v1/organizations/usage_report/messages`,
Admin API), read into `ProviderUsage` rows.

A page looks like `{"data": [{"starting_at": RFC 3339, "ending_at": ..., "results":
[{"model", "api_key_id", "workspace_id", "service_tier", "context_window",
"uncached_input_tokens", "cache_read_input_tokens", "cache_creation":
{"ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"}, "output_tokens",
"server_tool_use": {...}}]}], "has_more", "next_page"}`.

Anthropic's `input_tokens` exclude cache reads and writes; the ledger (and OpenAI)
count every prompt token as input, so input here is uncached + cache reads + cache
writes, and cached is the cache reads. The report has no request count and no cost
(the cost report is a separate endpoint), so both are None: not compared.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Any

from gateway.accounting.importers.openai_usage import FetchJson, QueryValue
from gateway.accounting.reconcile import ImportFailed, ProgressCallback, ProviderUsage, merge_rows

SOURCE = "anthropic usage report"
MAX_PAGES = 10_000  # a cursor that never ends must not hang a reconciliation


def parse_usage_page(page: Mapping[str, Any], source: str = SOURCE) -> list[ProviderUsage]:
    """The rows in one page (one per result; `merge_rows` joins a group's results)."""
    data = page.get("data")
    if not isinstance(data, list):
        raise ImportFailed(f"{source}: the page has no `data` list")
    rows = []
    for bucket in data:
        if not isinstance(bucket, dict):
            raise ImportFailed(f"{source}: a bucket is not an object")
        day = bucket_day(bucket.get("starting_at"), source)
        for result in bucket.get("results") or []:
            rows.append(result_row(day, result, source))
    return rows


def import_anthropic_usage(
    fetch: FetchJson,
    base_url: str,
    since: date,
    until: date,
    *,
    on_progress: ProgressCallback | None = None,
    source: str = SOURCE,
) -> list[ProviderUsage]:
    """Every page over the UTC days [since, until), grouped by model and api key.
    `base_url` is the API root ending in `/v1`."""
    rows = [row for page in usage_pages(fetch, base_url, since, until, on_progress) for row in parse_usage_page(page, source)]
    return merge_rows(r for r in rows if since <= r.day < until)


def usage_pages(fetch: FetchJson, base_url: str, since: date, until: date,
                on_progress: ProgressCallback | None = None) -> Iterator[dict[str, Any]]:
    """The usage report's pages over [since, until): daily buckets by model and api key."""
    params: dict[str, QueryValue] = {**window_params(since, until), "group_by[]": ["model", "api_key_id"], "limit": 31}
    return report_pages(fetch, base_url.rstrip("/") + "/organizations/usage_report/messages", params, on_progress)


def window_params(since: date, until: date) -> dict[str, QueryValue]:
    return {"starting_at": _rfc3339(since), "ending_at": _rfc3339(until), "bucket_width": "1d"}


def report_pages(fetch: FetchJson, url: str, params: Mapping[str, QueryValue],
                 on_progress: ProgressCallback | None = None, pages_before: int = 0) -> Iterator[dict[str, Any]]:
    """Follows an Admin API report's `next_page` while `has_more`; `on_progress` counts
    pages from `pages_before` (when one progress bar spans several reports)."""
    what = url.rsplit("/organizations/", 1)[-1]
    query = dict(params)
    seen: set[str] = set()
    for done in range(1, MAX_PAGES + 1):
        page = fetch(url, query)
        yield page
        if on_progress is not None:
            on_progress(pages_before + done, f"{what} page {done}")
        if not page.get("has_more"):
            return
        cursor = page.get("next_page")
        # A cursor that repeats would page forever and count buckets twice.
        if not isinstance(cursor, str) or not cursor or cursor in seen:
            raise ImportFailed(f"{what}: `has_more` is true but `next_page` is missing or repeats ({cursor!r})")
        seen.add(cursor)
        query = {**params, "page": cursor}
    raise ImportFailed(f"{what}: more than {MAX_PAGES} pages; narrow the date range")


def read_report_file(path: str | Path, since: date, until: date) -> list[ProviderUsage]:
    """A saved report: one page object, or a list of pages (as fetched, in order)."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ImportFailed(f"{path}: cannot read a JSON usage report: {exc}") from exc
    pages: Iterable[Any] = payload if isinstance(payload, list) else [payload]
    rows = []
    for page in pages:
        if not isinstance(page, dict):
            raise ImportFailed(f"{path}: expected a page object or a list of page objects")
        rows.extend(parse_usage_page(page, f"{SOURCE} {path.name}"))
    return merge_rows(r for r in rows if since <= r.day < until)


def result_row(day: date, result: Any, source: str) -> ProviderUsage:
    if not isinstance(result, dict):
        raise ImportFailed(f"{source}: a result for {day} is not an object")
    model = result.get("model")
    if not isinstance(model, str) or not model:
        raise ImportFailed(f"{source}: a result for {day} has no `model`; the report must be grouped by model")
    creation = result.get("cache_creation") or {}
    if not isinstance(creation, dict):
        raise ImportFailed(f"{source}: `cache_creation` for {model} on {day} is not an object")
    cache_read = token_count(result, "cache_read_input_tokens", source)
    hour_writes = token_count(creation, "ephemeral_1h_input_tokens", source)
    cache_write = token_count(creation, "ephemeral_5m_input_tokens", source) + hour_writes
    key = result.get("api_key_id")
    return ProviderUsage(
        day=day,
        model=model,
        key_id=key if isinstance(key, str) and key else None,
        input_tokens=token_count(result, "uncached_input_tokens", source) + cache_read + cache_write,
        cached_tokens=cache_read,
        output_tokens=token_count(result, "output_tokens", source),
        requests=None,
        cost_pico=None,
        source=source,
        cache_write_tokens=cache_write,
        cache_write_1h_tokens=hour_writes,
    )


def token_count(result: Mapping[str, Any], name: str, source: str) -> int:
    value = result.get(name, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ImportFailed(f"{source}: `{name}` should be a non-negative integer, got {value!r}")
    return value


def bucket_day(value: Any, source: str) -> date:
    if not isinstance(value, str):
        raise ImportFailed(f"{source}: a bucket has no `starting_at`")
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ImportFailed(f"{source}: `starting_at` {value!r} is not an RFC 3339 timestamp") from None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).astimezone(UTC).date()


def _rfc3339(day: date) -> str:
    return datetime.combine(day, time(0), tzinfo=UTC).isoformat().replace("+00:00", "Z")
