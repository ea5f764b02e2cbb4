"""The Anthropic simulator's Admin API reports: `GET /v1/organizations/usage_report/messages`
and `GET /v1/organizations/cost_report`, computed from what it billed.

Costs are exact decimals, in cents, as strings (as Anthropic sends them)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gateway.sim.anthropic_state import ClaudePrice, MessagesUsage
from gateway.sim.generation import SimRequestError

WIDTHS = {"1m": 60, "1h": 3600, "1d": 86400}
LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}  # (default, max) buckets a page
USAGE_GROUPS = {"api_key_id", "workspace_id", "model", "service_tier", "context_window"}
COST_GROUPS = {"workspace_id", "description"}
MILLION = Decimal(1_000_000)


def _time(query: Mapping[str, list[str]], name: str, required: bool) -> float | None:
    raw = query.get(name)
    if not raw:
        if required:
            raise SimRequestError(f"{name}: Field required", name)
        return None
    try:
        stamp = datetime.fromisoformat(raw[0].replace("Z", "+00:00"))
    except ValueError:
        raise SimRequestError(f"{name}: Input should be a valid RFC 3339 datetime", name) from None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


def _list(query: Mapping[str, list[str]], name: str) -> list[str]:
    return [v for v in [*query.get(name, []), *query.get(name + "[]", [])] if v]


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _buckets(query: Mapping[str, list[str]], width_name: str, now: float) -> tuple[list[float], int, str | None]:
    if width_name not in WIDTHS:
        raise SimRequestError(f"bucket_width: Input should be {', '.join(repr(w) for w in WIDTHS)}", "bucket_width")
    width = WIDTHS[width_name]
    start = _time(query, "starting_at", True)
    assert start is not None
    end = _time(query, "ending_at", False) or now
    page = (query.get("page") or [""])[0]
    if page:
        try:
            start = float(page.removeprefix("page_"))
        except ValueError:
            raise SimRequestError(f"page: invalid cursor {page!r}", "page") from None
    default, top = LIMITS[width_name]
    raw_limit = (query.get("limit") or [str(default)])[0]
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= top:
        raise SimRequestError(f"limit: Input should be an integer from 1 to {top}", "limit")
    starts: list[float] = []
    at = start
    while at < end:
        starts.append(at)
        at += width
    limit = int(raw_limit)
    more = len(starts) > limit
    return starts[:limit], width, f"page_{starts[limit]:.0f}" if more else None


def _in_bucket(records: Iterable[MessagesUsage], start: float, width: int) -> list[MessagesUsage]:
    return [r for r in records if start <= r.timestamp < start + width]


def usage_report(records: list[MessagesUsage], query: Mapping[str, list[str]], now: float) -> dict[str, Any]:
    group_by = _list(query, "group_by")
    if unknown := set(group_by) - USAGE_GROUPS:
        raise SimRequestError(f"group_by: unknown {sorted(unknown)}", "group_by")
    models, keys = set(_list(query, "models")), set(_list(query, "api_key_ids"))
    chosen = [r for r in records if (not models or r.model in models) and (not keys or r.api_key_id in keys)]
    starts, width, cursor = _buckets(query, (query.get("bucket_width") or ["1d"])[0], now)
    data = []
    for start in starts:
        groups: dict[tuple[str | None, str | None], list[MessagesUsage]] = defaultdict(list)
        for r in _in_bucket(chosen, start, width):
            groups[(r.model if "model" in group_by else None, r.api_key_id if "api_key_id" in group_by else None)].append(r)
        results = [
            {
                "uncached_input_tokens": sum(r.uncached_input for r in rs),
                "cache_creation": {"ephemeral_1h_input_tokens": sum(r.cache_write_1h for r in rs),
                                   "ephemeral_5m_input_tokens": sum(r.cache_write_5m for r in rs)},
                "cache_read_input_tokens": sum(r.cache_read for r in rs),
                "output_tokens": sum(r.output for r in rs),
                "server_tool_use": {"web_search_requests": 0},
                "api_key_id": key, "workspace_id": None, "model": model,
                "service_tier": "standard" if "service_tier" in group_by else None,
                "context_window": "0-200k" if "context_window" in group_by else None,
            }
            for (model, key), rs in groups.items()
        ]
        data.append({"starting_at": _rfc3339(start), "ending_at": _rfc3339(start + width), "results": results})
    return {"data": data, "has_more": cursor is not None, "next_page": cursor}


TOKEN_TYPES = (
    ("uncached_input_tokens", "uncached_input", "input"),
    ("cache_creation.ephemeral_5m_input_tokens", "cache_write_5m", "cache_write_5m"),
    ("cache_creation.ephemeral_1h_input_tokens", "cache_write_1h", "cache_write_1h"),
    ("cache_read_input_tokens", "cache_read", "cache_read"),
    ("output_tokens", "output", "output"),
)


def cost_cents(record: MessagesUsage, price: ClaudePrice) -> dict[str, Decimal]:
    """Each token type's cost of one call, exactly, in cents."""
    return {name: getattr(record, field) * getattr(price, rate) * 100 / MILLION for name, field, rate in TOKEN_TYPES}


def cost_report(records: list[MessagesUsage], query: Mapping[str, list[str]], prices: Mapping[str, ClaudePrice],
                now: float) -> dict[str, Any]:
    group_by = _list(query, "group_by")
    if unknown := set(group_by) - COST_GROUPS:
        raise SimRequestError(f"group_by: unknown {sorted(unknown)}", "group_by")
    width_name = (query.get("bucket_width") or ["1d"])[0]
    if width_name != "1d":
        raise SimRequestError("bucket_width: only '1d' is supported", "bucket_width")
    starts, width, cursor = _buckets(query, width_name, now)
    by_line = "description" in group_by
    data = []
    for start in starts:
        totals: dict[tuple[str | None, str | None], Decimal] = defaultdict(Decimal)
        for r in _in_bucket(records, start, width):
            price = prices.get(r.model)
            if price is None:
                continue
            for token_type, cents in cost_cents(r, price).items():
                totals[(r.model, token_type) if by_line else (None, None)] += cents
        results = [
            {
                "currency": "USD", "amount": str(amount), "workspace_id": None,
                "description": f"{model} {token_type}" if by_line else None,
                "cost_type": "tokens" if by_line else None, "context_window": "0-200k" if by_line else None,
                "model": model, "service_tier": "standard" if by_line else None, "token_type": token_type,
            }
            for (model, token_type), amount in totals.items()
        ]
        data.append({"starting_at": _rfc3339(start), "ending_at": _rfc3339(start + width), "results": results})
    return {"data": data, "has_more": cursor is not None, "next_page": cursor}


INJECT_FIELDS = ("uncached_input_tokens", "cache_read_input_tokens", "output_tokens")


def injected_usage(body: Any, request_id: str, now: float) -> MessagesUsage:
    """`POST /sim/usage/inject`: a billed call the gateway never saw, in the usage
    report's own field names (`cache_creation` per TTL); it shows in both reports."""
    if not isinstance(body, Mapping) or not isinstance(body.get("model"), str) or not isinstance(body.get("api_key_id"), str):
        raise SimRequestError("Expected {model, api_key_id, uncached_input_tokens, cache_read_input_tokens, "
                              "cache_creation: {ephemeral_5m_input_tokens, ephemeral_1h_input_tokens}, output_tokens}.")
    creation = body.get("cache_creation") or {}
    counts = [body.get(name, 0) for name in INJECT_FIELDS]
    counts += [creation.get(f"ephemeral_{ttl}_input_tokens", 0) if isinstance(creation, Mapping) else None for ttl in ("5m", "1h")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        raise SimRequestError("Token counts must be non-negative integers.")
    stamp = body.get("timestamp", now)
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        raise SimRequestError("timestamp: expected seconds since the epoch.", "timestamp")
    uncached, read, output, write_5m, write_1h = counts
    return MessagesUsage(float(stamp), body["model"], body["api_key_id"], request_id, uncached, read, write_5m, write_1h, output)
