"""Per route: how often answers escalated and why, and what each successful request
cost against what the route's strongest model alone would have cost."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import Engine, text

from gateway.accounting.money import usd
from gateway.accounting.prices import PriceCatalog
from gateway.routing.policy import Policy
from gateway.types.usage import Usage


@dataclass(slots=True)
class _Request:
    route: str
    cost: int = 0
    reasons: list[str] = field(default_factory=list)
    final_attempt: int = -1
    final_ok: bool = False
    final_usage: Usage = field(default_factory=Usage)


def route_report(engine: Engine, policy: Policy, catalog: PriceCatalog, since: date | None = None) -> dict[str, Any]:
    sql = ("SELECT request_id, route, attempt, status, checks, escalation, cost_pico, prompt_tokens, cached_tokens,"
           " completion_tokens FROM usage_events WHERE route IS NOT NULL AND kind = 'model'")
    params = {}
    if since is not None:
        sql += " AND day >= :since"
        params["since"] = since.isoformat()
    with engine.connect() as conn:
        rows = conn.execute(text(sql), params).all()
    requests: dict[str, _Request] = {}
    for r in rows:
        req = requests.setdefault(r.request_id, _Request(r.route))
        req.cost += r.cost_pico
        if r.escalation:
            req.reasons.extend(r.escalation.split(" -> ")[0].split(", "))
        if r.attempt > req.final_attempt and r.status == "ok":
            req.final_attempt = r.attempt
            req.final_ok = r.checks in (None, "passed")
            req.final_usage = Usage(prompt_tokens=r.prompt_tokens, cached_tokens=r.cached_tokens, completion_tokens=r.completion_tokens)
    by_route: dict[str, list[_Request]] = defaultdict(list)
    for req in requests.values():
        by_route[req.route].append(req)
    now = datetime.now(UTC)
    return {"routes": {name: _summary(name, reqs, policy, catalog, now) for name, reqs in sorted(by_route.items())}}


def _summary(name: str, reqs: list[_Request], policy: Policy, catalog: PriceCatalog, now: datetime) -> dict[str, Any]:
    route = policy.routes.get(name)
    strongest = route.chain[-1] if route is not None else None
    quote = None
    if strongest is not None:
        model = policy.models[strongest]
        quote = catalog.quote(strongest, model.upstream_model, model.price, now)
    successes = [r for r in reqs if r.final_ok]
    reasons = Counter(reason for r in reqs for reason in set(r.reasons))
    escalated = sum(1 for r in reqs if r.reasons)
    cost = sum(r.cost for r in reqs)
    # Estimate: the final answer's tokens, priced at the strongest model's rates.
    strong_cost = sum(quote.cost_pico(r.final_usage) for r in reqs) if quote is not None else None
    per_success = cost // len(successes) if successes else None
    strong_per_success = strong_cost // len(successes) if successes and strong_cost is not None else None
    return {
        "requests": len(reqs),
        "successful": len(successes),
        "escalation_rate": round(escalated / len(reqs), 4) if reqs else 0.0,
        "escalation_rate_by_reason": {k: round(v / len(reqs), 4) for k, v in sorted(reasons.items())},
        "cost_usd": usd(cost),
        "cost_per_successful_request_usd": usd(per_success) if per_success is not None else None,
        "strongest_model": strongest,
        "strongest_alone_per_successful_request_usd": usd(strong_per_success) if strong_per_success is not None else None,
    }


def report_text(report: dict[str, Any]) -> str:
    lines = ["route | requests | successful | escalation rate | by reason | cost/success | strongest alone/success",
             "---|---|---|---|---|---|---"]
    for name, s in report["routes"].items():
        reasons = ", ".join(f"{k} {v:.1%}" for k, v in s["escalation_rate_by_reason"].items()) or "-"
        lines.append(f"{name} | {s['requests']} | {s['successful']} | {s['escalation_rate']:.1%} | {reasons} | "
                     f"${s['cost_per_successful_request_usd']} | ${s['strongest_alone_per_successful_request_usd']} ({s['strongest_model']})")
    return "\n".join(lines) if report["routes"] else "no routed requests in the ledger yet"
