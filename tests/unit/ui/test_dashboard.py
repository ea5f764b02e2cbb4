"""Per-tenant lines of the dashboard: every tenant of the policy, shares of the whole,
and what the budget says about the month."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from gateway.accounting.finance import BudgetState
from gateway.routing.policy import Policy
from gateway.ui.dashboard import tenant_lines, upstream_kinds
from gateway.ui.figures import Month

PICO = 10**12
NOVEMBER = Month(date(2026, 11, 1))
MID_MONTH = datetime(2026, 11, 11, tzinfo=UTC)  # 10 of 30 days gone


def policy(**tenants: Any) -> Policy:
    return Policy.model_validate({
        "version": 1,
        "upstreams": {"hosted": {"kind": "openai", "base_url": "http://127.0.0.1:9100/v1"},
                      "pool": {"kind": "vllm", "replicas": ["http://127.0.0.1:9200/v1"]}},
        "models": {"m": {"upstream": "hosted", "price": {"input": 1, "output": 1}}},
        "tenants": tenants,
    })


def row(tenant: str, cost: str, saved: str = "0", requests: int = 1) -> dict[str, Any]:
    return {"tenant": tenant, "cost_usd": cost, "saved_usd": saved, "requests": requests}


def test_each_tenant_has_its_spend_share_and_forecast() -> None:
    p = policy(acme={"budget": {"usd": "500", "period": "month"}}, globex={}, idle={"budget": {"usd": "1", "period": "day"}})
    lines = tenant_lines([row("acme", "150.004", "2.5", 7), row("globex", "50.00"), row("gone", "0.000001")], p, NOVEMBER,
                         MID_MONTH, {"tenant:acme:month:2026-11-01": BudgetState(500 * PICO, 150 * PICO, PICO)},
                         {"acme": "tenant:acme:month:2026-11-01", "idle": "tenant:idle:day:2026-11-11"})
    by = {line.tenant: line for line in lines}
    assert list(by) == ["acme", "globex", "gone", "idle"], "the policy's tenants, and any that spent this month"
    acme = by["acme"]
    assert (acme.spend, acme.spend_exact, acme.saved, acme.requests, acme.share) == \
        (Decimal("150.004"), "150.004", Decimal("2.5"), 7, "75.0%")
    assert acme.budget == "$500.00 a month"
    assert acme.burn.forecast.quantize(Decimal("0.01")) == Decimal("450.01")
    assert acme.status == "forecast 90.0% of budget; $349.00 left now" and not acme.over
    assert by["globex"].status == "no budget set" and by["globex"].budget == "none"
    idle = by["idle"]
    assert (idle.spend, idle.share, idle.budget, idle.status) == (Decimal(0), "0.0%", "$1.00 a day", "forecast 0.0% of budget")


def test_a_forecast_past_the_budget_is_flagged_and_a_past_month_is_final() -> None:
    p = policy(acme={"budget": {"usd": "100", "period": "month"}}, daily={"budget": {"usd": "2", "period": "day"}},
               lifetime={"budget": {"usd": "10", "period": "total"}})
    rows = [row("acme", "40"), row("daily", "30"), row("lifetime", "4")]
    states = {"tenant:lifetime:total:": BudgetState(10 * PICO, 4 * PICO, 2 * PICO)}
    ids = {"lifetime": "tenant:lifetime:total:"}
    lines = {line.tenant: line for line in tenant_lines(rows, p, NOVEMBER, MID_MONTH, states, ids)}
    assert lines["acme"].over and lines["acme"].status == "forecast over by $20.00"
    assert lines["daily"].over and lines["daily"].status == "forecast over by $30.00"
    assert lines["lifetime"].status == "60.0% used in all; $4.00 left now" and not lines["lifetime"].over
    after = {line.tenant: line for line in tenant_lines(rows, p, NOVEMBER, datetime(2026, 12, 2, tzinfo=UTC), {}, {})}
    assert after["acme"].burn.final and after["acme"].status == "spent 40.0% of budget"


def test_upstreams_are_named_by_kind() -> None:
    assert upstream_kinds(policy()) == {"hosted": "hosted API", "pool": "self-hosted pool", "tool": "tool calls"}
