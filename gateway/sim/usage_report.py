"""What the simulated provider billed, served like OpenAI's Usage and Costs APIs.

Reconciliation compares the gateway's ledger with these reports, so every billed
request is recorded here, and tests can inject records the gateway never saw or omit
ones it did.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, NamedTuple, Protocol, TypeVar

import orjson

from gateway.sim.generation import SimRequestError


class ModelPrice(NamedTuple):
    """USD per 1M tokens."""

    input: float
    cached_input: float
    output: float


def default_prices() -> dict[str, ModelPrice]:
    return {
        "sim-small": ModelPrice(0.15, 0.075, 0.60),
        "sim-large": ModelPrice(2.50, 1.25, 10.00),
        "bench-model": ModelPrice(0.15, 0.075, 0.60),
        "gpt-4o-mini": ModelPrice(0.15, 0.075, 0.60),
        "text-embedding-3-small": ModelPrice(0.02, 0.0, 0.0),
    }


def api_key_id(authorization: str) -> str:
    """A stable, non-secret id for the bearer key, like the ids OpenAI's reports show."""
    key = authorization.removeprefix("Bearer ").strip()
    return "key_" + hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class UsageRecord:
    timestamp: float
    kind: str  # "completions" | "embeddings"
    model: str
    api_key_id: str
    request_id: str
    input_tokens: int  # includes cached tokens, as OpenAI reports it
    cached_tokens: int
    output_tokens: int

    def cost_usd(self, prices: Mapping[str, ModelPrice]) -> float:
        price = prices.get(self.model, ModelPrice(0.0, 0.0, 0.0))
        uncached = self.input_tokens - self.cached_tokens
        return (uncached * price.input + self.cached_tokens * price.cached_input + self.output_tokens * price.output) / 1e6


class BilledCall(Protocol):
    """A simulator's record of one billed call: a dataclass with the call's request id."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def request_id(self) -> str: ...


R = TypeVar("R", bound=BilledCall)


@dataclass
class UsageLedger(Generic[R]):
    """Every billed request (a simulator's own record type: UsageRecord here, Anthropic's
    MessagesUsage). With a `journal` file the report outlives the process, as a
    provider's does: each record is appended to it as one JSON line, and a simulator
    started on the same file reports the earlier usage too (`gateway demo` keeps them
    under var/demo/, so reconciliation still matches after a restart)."""

    records: list[R] = field(default_factory=list)
    journal: Path | None = None

    @classmethod
    def kept_in(cls, journal: Path, record_type: type[R]) -> UsageLedger[R]:
        """The records already in `journal` (a last line cut short by a crash is
        skipped), and every new one appended to it."""
        records, skipped = [], False
        if journal.exists():
            for line in journal.read_bytes().splitlines():
                try:
                    records.append(record_type(**orjson.loads(line)))
                except (orjson.JSONDecodeError, TypeError):
                    skipped = True
        journal.parent.mkdir(parents=True, exist_ok=True)
        ledger = cls(records, journal)
        if skipped:
            ledger._rewrite()  # so the next record starts on a line of its own
        return ledger

    def add(self, record: R) -> None:
        self.records.append(record)
        if self.journal is not None:
            with self.journal.open("ab") as out:
                out.write(orjson.dumps(dataclasses.asdict(record)) + b"\n")

    def omit(self, request_id: str) -> bool:
        kept = [r for r in self.records if r.request_id != request_id]
        removed = len(kept) != len(self.records)
        self.records = kept
        if removed:
            self._rewrite()
        return removed

    def clear(self) -> None:
        self.records.clear()
        self._rewrite()

    def _rewrite(self) -> None:
        if self.journal is not None:
            self.journal.write_bytes(b"".join(orjson.dumps(dataclasses.asdict(r)) + b"\n" for r in self.records))


_WIDTHS = {"1m": 60, "1h": 3600, "1d": 86400}
_LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}  # (default, max) buckets per page
_USAGE_GROUPS = {"model", "api_key_id", "project_id", "user_id", "batch"}
_COST_GROUPS = {"line_item", "api_key_id", "project_id"}


def _list_param(query: Mapping[str, list[str]], name: str) -> list[str]:
    values = [*query.get(name, []), *query.get(name + "[]", [])]
    return [item for value in values for item in value.split(",") if item]


def _int_param(query: Mapping[str, list[str]], name: str, default: int | None) -> int:
    raw = query.get(name)
    if not raw:
        if default is None:
            raise SimRequestError(f"Missing required parameter: '{name}'.", name)
        return default
    try:
        return int(raw[0])
    except ValueError:
        raise SimRequestError(f"Invalid '{name}': expected an integer.", name) from None


@dataclass(frozen=True)
class _Window:
    buckets: list[int]  # bucket start times on this page
    width: int
    has_more: bool
    next_page: str | None


def _window(query: Mapping[str, list[str]], width_name: str, max_limit: int | None = None) -> _Window:
    if width_name not in _WIDTHS:
        raise SimRequestError(f"Invalid 'bucket_width': {width_name!r}.", "bucket_width")
    width = _WIDTHS[width_name]
    start = _int_param(query, "start_time", None)
    end = _int_param(query, "end_time", int(time.time()) + 1)
    default_limit, top = _LIMITS[width_name]
    limit = min(_int_param(query, "limit", default_limit), max_limit or top)
    page = query.get("page", [""])[0]
    first = start
    if page:
        cursor = page.removeprefix("page_")
        if not cursor.isdigit():
            raise SimRequestError(f"Invalid 'page': {page!r}.", "page")
        first = int(cursor)
    starts = list(range(first, end, width))
    more = len(starts) > limit
    return _Window(starts[:limit], width, more, f"page_{starts[limit]}" if more else None)


def _bucketed(records: Iterable[UsageRecord], window: _Window) -> dict[int, list[UsageRecord]]:
    by_bucket: dict[int, list[UsageRecord]] = defaultdict(list)
    if not window.buckets:
        return by_bucket
    first, last_end = window.buckets[0], window.buckets[-1] + window.width
    for record in records:
        if first <= record.timestamp < last_end:
            by_bucket[first + int((record.timestamp - first) // window.width) * window.width].append(record)
    return by_bucket


def _page(window: _Window, results_for: Any) -> dict[str, Any]:
    data = [
        {"object": "bucket", "start_time": s, "end_time": s + window.width, "results": results_for(s)}
        for s in window.buckets
    ]
    return {"object": "page", "data": data, "has_more": window.has_more, "next_page": window.next_page}


def usage_page(ledger: UsageLedger[UsageRecord], query: Mapping[str, list[str]], kind: str) -> dict[str, Any]:
    """`GET /v1/organization/usage/{completions,embeddings}`."""
    group_by = _list_param(query, "group_by")
    if unknown := set(group_by) - _USAGE_GROUPS:
        raise SimRequestError(f"Invalid 'group_by': {sorted(unknown)}.", "group_by")
    models, keys = set(_list_param(query, "models")), set(_list_param(query, "api_key_ids"))
    window = _window(query, query.get("bucket_width", ["1d"])[0])
    selected = (
        r for r in ledger.records
        if r.kind == kind and (not models or r.model in models) and (not keys or r.api_key_id in keys)
    )
    by_bucket = _bucketed(selected, window)

    def results(start: int) -> list[dict[str, Any]]:
        groups: dict[tuple[Any, ...], list[UsageRecord]] = defaultdict(list)
        for r in by_bucket.get(start, []):
            groups[("model" in group_by and r.model, "api_key_id" in group_by and r.api_key_id)].append(r)
        return [_usage_result(kind, model or None, key or None, rs) for (model, key), rs in groups.items()]

    return _page(window, results)


def _usage_result(kind: str, model: str | None, key: str | None, records: list[UsageRecord]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "object": f"organization.usage.{kind}.result",
        "input_tokens": sum(r.input_tokens for r in records),
        "num_model_requests": len(records),
        "project_id": None,
        "user_id": None,
        "api_key_id": key,
        "model": model,
    }
    if kind == "completions":
        cached = sum(r.cached_tokens for r in records)
        result.update(
            output_tokens=sum(r.output_tokens for r in records),
            input_cached_tokens=cached,
            input_uncached_tokens=result["input_tokens"] - cached,
            input_audio_tokens=0,
            output_audio_tokens=0,
            batch=False,
        )
    return result


def costs_page(ledger: UsageLedger[UsageRecord], query: Mapping[str, list[str]], prices: Mapping[str, ModelPrice]) -> dict[str, Any]:
    """`GET /v1/organization/costs`: one result per line item (model) per day."""
    group_by = _list_param(query, "group_by")
    if unknown := set(group_by) - _COST_GROUPS:
        raise SimRequestError(f"Invalid 'group_by': {sorted(unknown)}.", "group_by")
    width_name = query.get("bucket_width", ["1d"])[0]
    if width_name != "1d":
        raise SimRequestError("Invalid 'bucket_width': only '1d' is supported.", "bucket_width")
    window = _window(query, width_name, max_limit=180)
    by_bucket = _bucketed(ledger.records, window)

    def results(start: int) -> list[dict[str, Any]]:
        totals: dict[tuple[str, str | None], float] = defaultdict(float)
        for r in by_bucket.get(start, []):
            totals[(r.model, r.api_key_id if "api_key_id" in group_by else None)] += r.cost_usd(prices)
        return [
            {
                "object": "organization.costs.result",
                "amount": {"value": value, "currency": "usd"},
                "line_item": model,
                "project_id": None,
                **({"api_key_id": key} if "api_key_id" in group_by else {}),
            }
            for (model, key), value in totals.items()
        ]

    return _page(window, results)


def injected_record(body: Any, request_id: str) -> UsageRecord:
    """`POST /sim/usage/inject`: a billed record the gateway never saw."""
    if not isinstance(body, Mapping) or not isinstance(body.get("model"), str):
        raise SimRequestError("Expected {model, api_key_id, input_tokens, output_tokens, cached_tokens}.")
    try:
        return UsageRecord(
            timestamp=float(body.get("timestamp") or time.time()),
            kind=str(body.get("kind", "completions")),
            model=body["model"],
            api_key_id=str(body.get("api_key_id", "key_injected")),
            request_id=str(body.get("request_id") or request_id),
            input_tokens=int(body.get("input_tokens", 0)),
            cached_tokens=int(body.get("cached_tokens", 0)),
            output_tokens=int(body.get("output_tokens", 0)),
        )
    except (TypeError, ValueError):
        raise SimRequestError("Token counts and timestamp must be numbers.") from None
