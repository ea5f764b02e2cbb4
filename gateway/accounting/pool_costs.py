"""A self-hosted pool's whole cost over a period, split to tenants by a stated rule,
next to what its per-token internal rate recovered.

The cost: replicas x GPUs per replica x GPU-hour rate x hours, idle time included, from
the `gpu_hours` rows in `pricing/` (their `replicas`, else the policy's replica count).

The rule: a tenant's share is the pool time its requests took, estimated from its
tokens the way the pricing row states a replica's throughput: uncached prompt tokens /
expected input tokens per second + output tokens / expected output tokens per second
(a prefix-cache hit skips prefill, so cached tokens take no time). The pool's capacity
is replicas x seconds in the period. Tenants pay cost x their time / capacity; the rest
is idle. If the tenants' time passes the capacity (the pool beat its expected
throughput), the whole cost is split by their time and nothing is idle.

Exact: the cost is rounded once, to a pico-dollar, and apportioned by largest
remainder, so the tenants' shares plus idle equal the pool's cost exactly. Recovered is
what the ledger booked at the internal per-token rate; recovered - share is each
tenant's over-recovery (negative: under-recovery), and idle is never recovered."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from fractions import Fraction
from typing import Any

from sqlalchemy import Engine, text

from gateway.accounting.money import PICO_PER_USD, usd
from gateway.accounting.price_sources import GpuRate
from gateway.accounting.prices import PriceCatalog
from gateway.routing.policy import Policy

IDLE = "(idle)"
RULE = ("share = pool cost x (uncached prompt tokens / input tokens per second + output tokens / output tokens per second)"
        " / (replicas x seconds); the remainder is idle")
USAGE = (
    "SELECT tenant, COUNT(*) AS requests, SUM(prompt_tokens) AS prompt, SUM(cached_tokens) AS cached,"
    " SUM(completion_tokens) AS completion, SUM(cost_pico) AS recovered, SUM(CASE WHEN usage_known THEN 0 ELSE 1 END) AS unknown"
    " FROM usage_events WHERE kind = 'model' AND upstream = :upstream AND day >= :first AND day <= :last"
    " AND created_at >= :start AND created_at < :end GROUP BY tenant ORDER BY tenant"
)
BY_REPLICA = (
    "SELECT replica, tenant, COUNT(*) AS requests, SUM(prompt_tokens) AS prompt, SUM(cached_tokens) AS cached"
    " FROM usage_events WHERE kind = 'model' AND upstream = :upstream AND replica IS NOT NULL AND day >= :first"
    " AND day <= :last AND created_at >= :start AND created_at < :end GROUP BY replica, tenant ORDER BY replica, tenant"
)


@dataclass(frozen=True, slots=True)
class TenantUsage:
    tenant: str
    requests: int = 0
    uncached_prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    recovered_pico: int = 0
    usage_unknown: int = 0  # attempts with no usage (failed, cancelled): no time counted for them


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of the period under one GPU rate."""

    start: datetime
    end: datetime
    rate: GpuRate
    replicas: int


@dataclass
class Split:
    cost_pico: int = 0
    idle_pico: int = 0
    shares: dict[str, int] = field(default_factory=dict)
    busy_s: dict[str, Fraction] = field(default_factory=dict)
    capacity_s: Fraction = Fraction(0)


def split_segment(segment: Segment, usage: Sequence[TenantUsage]) -> Split:
    """One segment's cost, apportioned to tenants and idle; pure and exact."""
    rate = segment.rate
    micros = (segment.end - segment.start) // timedelta(microseconds=1)
    cost = round(Fraction(rate.gpu_hour_usd) * rate.gpus * segment.replicas * micros * PICO_PER_USD / (3600 * 10**6))
    # Weights in units of 1 / (input_tps x output_tps x 10^6) seconds: integers, so exact.
    weights = {u.tenant: (u.uncached_prompt_tokens * rate.output_tps + u.completion_tokens * rate.input_tps) * 10**6 for u in usage}
    capacity = segment.replicas * micros * rate.input_tps * rate.output_tps
    busy = sum(weights.values())
    parts = dict(weights)
    if busy <= capacity:
        parts[IDLE] = capacity - busy
    shares = apportion(cost, parts)
    unit = Fraction(1, rate.input_tps * rate.output_tps * 10**6)
    return Split(cost, shares.pop(IDLE, 0), shares, {t: w * unit for t, w in weights.items()}, capacity * unit)


def apportion(total: int, weights: dict[str, int]) -> dict[str, int]:
    """`total` split in proportion to `weights`, in whole units, summing to `total`
    exactly (largest remainder; ties by name)."""
    whole = sum(weights.values())
    if whole <= 0:  # nothing to weigh by: it was all idle
        return dict.fromkeys(weights, 0) | {IDLE: total}
    floors = {name: total * w // whole for name, w in weights.items()}
    left = total - sum(floors.values())
    by_remainder = sorted(weights, key=lambda name: (-(total * weights[name] % whole), name))
    for name in by_remainder[:left]:
        floors[name] += 1
    return floors


def segments(rows: Sequence[tuple[date, GpuRate]], replicas_in_policy: int, start: datetime, end: datetime) -> list[Segment]:
    """The period cut where the rate changes; before the first row nothing is priced."""
    out = []
    dated = sorted(rows, key=lambda r: r[0])
    for i, (since, rate) in enumerate(dated):
        seg_start = max(start, datetime.combine(since, time(), UTC))
        seg_end = min(end, datetime.combine(dated[i + 1][0], time(), UTC)) if i + 1 < len(dated) else end
        if seg_start < seg_end:
            out.append(Segment(seg_start, seg_end, rate, rate.replicas or replicas_in_policy))
    return out


def pool_cost_report(engine: Engine, policy: Policy, catalog: PriceCatalog, upstream: str, start: datetime,
                     end: datetime) -> dict[str, Any]:
    config = policy.upstreams[upstream]
    notes: list[str] = []
    models = sorted(name for name, m in policy.models.items() if m.upstream == upstream)
    rows, source = _gpu_rows(catalog, policy, models, notes)
    report: dict[str, Any] = {"upstream": upstream, "from": start.isoformat(), "until": end.isoformat(), "models": models,
                              "rule": RULE, "notes": notes}
    if not rows:
        notes.append(f"no `gpu_hours` row in pricing/ for the models on `{upstream}` ({', '.join(models) or 'none'}): "
                     "its cost cannot be split")
        return report
    report["rate_source"] = source
    totals: dict[str, TenantUsage] = {}
    split = Split()
    cut = segments(rows, len(config.urls()), start, end)
    for seg in cut:
        usage = _usage(engine, upstream, seg.start, seg.end)
        part = split_segment(seg, usage)
        split.cost_pico += part.cost_pico
        split.idle_pico += part.idle_pico
        split.capacity_s += part.capacity_s
        for tenant, pico in part.shares.items():
            split.shares[tenant] = split.shares.get(tenant, 0) + pico
            split.busy_s[tenant] = split.busy_s.get(tenant, Fraction(0)) + part.busy_s[tenant]
        for u in usage:
            totals[u.tenant] = _add(totals.get(u.tenant), u)
    if cut and cut[0].start > start:
        notes.append(f"nothing priced before {cut[0].start.date()}: the first gpu_hours row takes effect then")
    unknown = sum(u.usage_unknown for u in totals.values())
    if unknown:
        notes.append(f"{unknown} attempts have no usage (failed, cancelled, spilled): no pool time is counted for them")
    if totals and not any(u.cached_tokens for u in totals.values()):
        notes.append("no cached tokens booked: run vLLM with --enable-prompt-tokens-details, or cached prefill counts as work")
    recovered = sum(u.recovered_pico for u in totals.values())
    busy = sum(split.busy_s.values(), Fraction(0))
    report.update({
        "segments": [{"from": s.start.isoformat(), "until": s.end.isoformat(), "replicas": s.replicas, "gpus_per_replica": s.rate.gpus,
                      "gpu_hour_usd": str(s.rate.gpu_hour_usd)} for s in cut],
        "cost_usd": usd(split.cost_pico), "idle_usd": usd(split.idle_pico), "recovered_usd": usd(recovered),
        "recovered_minus_cost_usd": usd(recovered - split.cost_pico),
        "utilisation": float(round(busy / split.capacity_s, 4)) if split.capacity_s else None,
        "tenants": [_tenant_row(t, totals[t], split) for t in sorted(totals)],
        "replicas": _by_replica(engine, upstream, start, end),
    })
    return report


def _tenant_row(tenant: str, usage: TenantUsage, split: Split) -> dict[str, Any]:
    share = split.shares.get(tenant, 0)
    return {"tenant": tenant, "requests": usage.requests, "uncached_prompt_tokens": usage.uncached_prompt_tokens,
            "cached_tokens": usage.cached_tokens, "completion_tokens": usage.completion_tokens,
            "pool_seconds": float(round(split.busy_s.get(tenant, Fraction(0)), 3)), "share_usd": usd(share),
            "recovered_usd": usd(usage.recovered_pico), "recovered_minus_share_usd": usd(usage.recovered_pico - share)}


def _gpu_rows(catalog: PriceCatalog, policy: Policy, models: list[str],
              notes: list[str]) -> tuple[list[tuple[date, GpuRate]], str | None]:
    """The GPU rates of the first model on the pool that has some; a note if others differ."""
    found: list[tuple[str, list[tuple[date, GpuRate]]]] = []
    for model in models:
        names = dict.fromkeys([model, policy.models[model].upstream_model or model])
        rows = [(row.effective_from, row.gpu) for name in names for row in catalog.history(name) if row.gpu is not None]
        if rows:
            found.append((model, rows))
    if not found:
        return [], None
    chosen, rows = found[0]
    for model, other in found[1:]:
        if other != rows:
            notes.append(f"{model} has other gpu_hours rows than {chosen}; the pool's cost uses {chosen}'s")
    return rows, f"pricing/ gpu_hours rows of {chosen}"


def _window(start: datetime, end: datetime) -> dict[str, Any]:
    return {"start": start, "end": end, "first": start.date().isoformat(), "last": end.date().isoformat()}


def _usage(engine: Engine, upstream: str, start: datetime, end: datetime) -> list[TenantUsage]:
    with engine.connect() as conn:
        rows = conn.execute(text(USAGE), {"upstream": upstream, **_window(start, end)}).mappings().all()
    return [TenantUsage(r["tenant"], int(r["requests"]), max(0, int(r["prompt"] or 0) - int(r["cached"] or 0)), int(r["cached"] or 0),
                        int(r["completion"] or 0), int(r["recovered"] or 0), int(r["unknown"] or 0)) for r in rows]


def _by_replica(engine: Engine, upstream: str, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Which tenants each replica served in the period, from the ledger (every gateway replica's)."""
    with engine.connect() as conn:
        rows = conn.execute(text(BY_REPLICA), {"upstream": upstream, **_window(start, end)}).mappings().all()
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        replica = out.setdefault(r["replica"], {"replica": r["replica"], "requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "tenants": {}})
        replica["requests"] += int(r["requests"])
        replica["prompt_tokens"] += int(r["prompt"] or 0)
        replica["cached_tokens"] += int(r["cached"] or 0)
        replica["tenants"][r["tenant"]] = int(r["requests"])
    return list(out.values())


def _add(a: TenantUsage | None, b: TenantUsage) -> TenantUsage:
    if a is None:
        return b
    return TenantUsage(a.tenant, a.requests + b.requests, a.uncached_prompt_tokens + b.uncached_prompt_tokens,
                       a.cached_tokens + b.cached_tokens, a.completion_tokens + b.completion_tokens,
                       a.recovered_pico + b.recovered_pico, a.usage_unknown + b.usage_unknown)


def period(since: date, until: date | None, now: datetime) -> tuple[datetime, datetime]:
    """[00:00 UTC of `since`, 00:00 UTC of `until` or now)."""
    start = datetime.combine(since, time(), UTC)
    end = datetime.combine(until, time(), UTC) if until is not None else now
    if end <= start:
        raise ValueError(f"the period from {since} must end after it starts")
    return start, min(end, now)


def pool_upstreams(policy: Policy, name: str | None = None) -> Iterator[str]:
    if name is not None:
        if name not in policy.upstreams or policy.upstreams[name].kind != "vllm":
            raise ValueError(f"`{name}` is not a vLLM pool in the policy")
        yield name
        return
    yield from (n for n, u in policy.upstreams.items() if u.kind == "vllm")


def report_text(reports: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for r in reports:
        lines.append(f"pool {r['upstream']} ({', '.join(r['models'])}) from {r['from']} until {r['until']}")
        if "cost_usd" not in r:
            lines += [f"  {n}" for n in r["notes"]]
            continue
        lines.append(f"  cost ${r['cost_usd']} (idle ${r['idle_usd']}, utilisation {r['utilisation']})"
                     f"  recovered ${r['recovered_usd']}  recovered - cost ${r['recovered_minus_cost_usd']}")
        lines.append(f"  rule: {r['rule']}")
        lines.append("  tenant | requests | uncached prompt | cached | output | pool s | share $ | recovered $ | recovered - share $")
        for t in r["tenants"]:
            lines.append(f"  {t['tenant']} | {t['requests']} | {t['uncached_prompt_tokens']} | {t['cached_tokens']} | {t['completion_tokens']}"
                         f" | {t['pool_seconds']} | {t['share_usd']} | {t['recovered_usd']} | {t['recovered_minus_share_usd']}")
        lines.append(f"  {IDLE} | | | | | | {r['idle_usd']} | 0 | -{r['idle_usd']}")
        lines += [f"  note: {n}" for n in r["notes"]]
    return "\n".join(lines) if lines else "no vLLM pool in the policy"
