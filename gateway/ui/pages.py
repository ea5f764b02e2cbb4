"""The data behind each dashboard page and each CSV export. A table's CSV is built by the
very call the admin API answers that query with, so the two are equal byte for byte;
every table names that admin request next to its CSV link."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import Engine

from gateway.accounting.finance import budget_states, reconciliation_rows, task_rows, tasks_to_csv
from gateway.accounting.hold_and_settle import tenant_claim
from gateway.accounting.pool_costs import pool_cost_report
from gateway.accounting.prices import PriceCatalog
from gateway.accounting.reports import cost_rows, rows_to_csv
from gateway.routing.policy import Policy
from gateway.ui.chart import spend_per_day
from gateway.ui.dashboard import tenant_lines, upstream_kinds
from gateway.ui.figures import Burn, Month

# Dashboard table -> the admin API's `group_by` for it.
COST_TABLES = {"tenants": ["tenant"], "days": ["day", "tenant"], "models": ["model"], "upstreams": ["upstream"]}
TABLES = (*COST_TABLES, "tasks")
TASKS_ON_PAGE = 50


@dataclass(frozen=True, slots=True)
class Export:
    ui: str  # the dashboard's download (session cookie)
    admin: str  # the same CSV from the admin API (bearer admin key)


def exports(month: Month, tenant: str | None) -> dict[str, Export]:
    out = {}
    for table in TABLES:
        ui = {"month": month.key, **({"tenant": tenant} if tenant else {})}
        window = {"from": month.start.isoformat(), "to": month.end.isoformat(), **({"tenant": tenant} if tenant else {})}
        if table == "tasks":
            admin = f"/admin/tasks?{urlencode({**window, 'format': 'csv'})}"
        else:
            admin = f"/admin/costs?{urlencode({'group_by': ','.join(COST_TABLES[table]), **window, 'format': 'csv'}, safe=',')}"
        out[table] = Export(f"/ui/export/{table}.csv?{urlencode(ui)}", admin)
    return out


def table_csv(reader: Engine, table: str, month: Month, tenant: str | None) -> str:
    """The CSV of one table, as the admin API writes it. Raises KeyError for an unknown table."""
    if table == "tasks":
        return tasks_to_csv(task_rows(reader, month.start, month.end, tenant))
    group_by = COST_TABLES[table]
    return rows_to_csv(cost_rows(reader, group_by, month.start, month.end, tenant), group_by)


def dashboard(reader: Engine, policy: Policy, catalog: PriceCatalog, month: Month, tenant: str | None,
              now: datetime) -> dict[str, Any]:
    """The first page's context. Blocking queries: run it in a worker thread."""
    everyone = cost_rows(reader, ["tenant"], month.start, month.end)
    budget_ids = {name: tenant_claim(name, t.budget, now).budget_id for name, t in policy.tenants.items() if t.budget is not None}
    lines = tenant_lines(everyone, policy, month, now, budget_states(reader, budget_ids.values()), budget_ids)
    shown = [line for line in lines if tenant is None or line.tenant == tenant]
    upstreams = cost_rows(reader, ["upstream"], month.start, month.end, tenant)
    tasks = task_rows(reader, month.start, month.end, tenant, limit=TASKS_ON_PAGE + 1)
    total = sum((line.spend for line in shown), Decimal(0))
    return {
        "month": month, "tenant": tenant, "now": now, "month_over": month.over(now),
        "tenant_choices": [line.tenant for line in lines],
        "lines": shown,
        "shown_total": total,
        "shown_forecast": Burn.of(total, month, now).forecast,
        "shown_saved": sum((line.saved for line in shown), Decimal(0)),
        "shown_requests": sum(line.requests for line in shown),
        "chart": spend_per_day(cost_rows(reader, ["day", "tenant"], month.start, month.end, tenant), month),
        "models": cost_rows(reader, ["model"], month.start, month.end, tenant),
        "upstreams": upstreams,
        "kinds": upstream_kinds(policy),
        "pools": _pools(policy, upstreams),
        "pool_costs": pool_costs(reader, policy, catalog, month, now),
        "tasks": tasks[:TASKS_ON_PAGE],
        "tasks_hidden": max(0, len(tasks) - TASKS_ON_PAGE),
        "exports": exports(month, tenant),
    }


@dataclass(frozen=True, slots=True)
class PoolUse:
    name: str
    requests: int
    tokens: int
    cost_usd: str


def _pools(policy: Policy, upstream_rows: list[dict[str, Any]]) -> list[PoolUse]:
    by_name = {row["upstream"]: row for row in upstream_rows}
    pools = []
    for name, upstream in sorted(policy.upstreams.items()):
        if upstream.kind != "vllm":
            continue
        row = by_name.get(name, {})
        pools.append(PoolUse(name, int(row.get("requests", 0)), int(row.get("input_tokens", 0)) + int(row.get("output_tokens", 0)),
                             row.get("cost_usd", "0.000000")))
    return pools


def pool_costs(reader: Engine, policy: Policy, catalog: PriceCatalog, month: Month, now: datetime) -> list[dict[str, Any]]:
    """Each pool's whole GPU cost for the month so far, split to tenants with idle and
    recovery beside it: the report `gateway pool costs` prints and `/admin/pool` serves."""
    start = datetime.combine(month.start, time(), UTC)
    end = min(datetime.combine(month.end, time(), UTC), now)
    if end <= start:
        return [{"upstream": name, "notes": ["the month has not begun"]} for name in pool_upstreams(policy)]
    return [pool_cost_report(reader, policy, catalog, name, start, end) for name in pool_upstreams(policy)]


def reconcile_window(month: Month, now: datetime) -> tuple[date, date]:
    """The month's whole days, up to tomorrow at most (the provider has no later usage)."""
    return month.start, min(month.end, now.astimezone(UTC).date() + timedelta(days=1))


def hosted_upstreams(policy: Policy) -> list[str]:
    return sorted(name for name, upstream in policy.upstreams.items() if upstream.kind != "vllm")


def pool_upstreams(policy: Policy) -> list[str]:
    return sorted(name for name, upstream in policy.upstreams.items() if upstream.kind == "vllm")


def reconcile_export(provider: str, month: Month, now: datetime) -> Export:
    since, until = reconcile_window(month, now)
    admin = {"provider": provider, "since": since.isoformat(), "until": until.isoformat(), "format": "csv"}
    return Export(f"/ui/export/reconcile.csv?{urlencode({'month': month.key, 'provider': provider})}", f"/admin/reconcile?{urlencode(admin)}")


def provider_section(name: str, report: dict[str, Any] | None, error: str | None, month: Month, now: datetime) -> dict[str, Any]:
    rows = reconciliation_rows(report) if report is not None else []
    return {"name": name, "report": report, "error": error, "rows": rows,
            "differ": sum(row["status"] != "matched" for row in rows), "exports": reconcile_export(name, month, now)}
