"""What the dashboard's first page shows, worked out from ledger rows and the policy:
per tenant the month's spend, its share, cache savings, budget, burn and forecast; and
which upstreams are the self-hosted pool. Pure functions of their inputs, so tested
without a server; the queries are in gateway/accounting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from gateway.accounting.finance import BudgetState
from gateway.accounting.money import PICO_PER_USD
from gateway.routing.policy import Budget, Policy
from gateway.ui.figures import Burn, Month, dollars, percent


@dataclass(frozen=True, slots=True)
class TenantLine:
    tenant: str
    spend: Decimal
    spend_exact: str  # as the ledger has it, for the cell's title and the CSV
    saved: Decimal
    requests: int
    share: str
    budget: str
    burn: Burn
    status: str
    over: bool  # the forecast (or, for a past month, the spend) passes the budget


def tenant_lines(rows: Sequence[Mapping[str, Any]], policy: Policy, month: Month, now: datetime,
                 budgets_now: Mapping[str, BudgetState], budget_ids: Mapping[str, str]) -> list[TenantLine]:
    """`rows`: the admin API's cost rows grouped by tenant for the month (every tenant,
    so shares are of the whole); every tenant of the policy has a line, spend or not,
    and so has a tenant the policy no longer names that spent this month.
    `budget_ids`: tenant -> the id of its budget's current period."""
    by_tenant = {str(r["tenant"]): r for r in rows}
    total = sum((Decimal(r["cost_usd"]) for r in rows), Decimal(0))
    lines = []
    for tenant in sorted(set(policy.tenants) | set(by_tenant)):
        row = by_tenant.get(tenant, {})
        spend = Decimal(row.get("cost_usd", "0"))
        configured = policy.tenants[tenant].budget if tenant in policy.tenants else None
        burn = Burn.of(spend, month, now)
        state = budgets_now.get(budget_ids.get(tenant, ""))
        status, over = budget_status(configured, burn, month, state)
        lines.append(TenantLine(tenant, spend, row.get("cost_usd", "0.000000"), Decimal(row.get("saved_usd", "0")),
                                int(row.get("requests", 0)), percent(spend, total), budget_text(configured), burn, status, over))
    return lines


def budget_text(budget: Budget | None) -> str:
    if budget is None:
        return "none"
    amount = dollars(budget.usd)
    return {"month": f"{amount} a month", "day": f"{amount} a day", "total": f"{amount} in all"}[budget.period]


def budget_for_month(budget: Budget, month: Month) -> Decimal | None:
    if budget.period == "month":
        return budget.usd
    if budget.period == "day":
        return budget.usd * month.days
    return None  # a lifetime budget has no monthly share


def budget_status(budget: Budget | None, burn: Burn, month: Month, state: BudgetState | None) -> tuple[str, bool]:
    """A few words on the budget, and whether the month's spend passes it."""
    if budget is None:
        return "no budget set", False
    left = f"; {dollars(Decimal(state.left_pico) / PICO_PER_USD)} left now" if state is not None and state.left_pico is not None else ""
    monthly = budget_for_month(budget, month)
    if monthly is None:
        used = Decimal(state.spent_pico + state.reserved_pico) / PICO_PER_USD if state is not None else Decimal(0)
        return f"{percent(used, budget.usd)} used in all{left}", used > budget.usd
    what = "spent" if burn.final else "forecast"
    if burn.forecast > monthly:
        return f"{what} over by {dollars(burn.forecast - monthly)}{left}", True
    return f"{what} {percent(burn.forecast, monthly)} of budget{left}", False


def upstream_kinds(policy: Policy) -> dict[str, str]:
    """Upstream name -> how the dashboard calls it."""
    kinds = {name: "self-hosted pool" if u.kind == "vllm" else "hosted API" for name, u in policy.upstreams.items()}
    kinds["tool"] = "tool calls"
    return kinds
