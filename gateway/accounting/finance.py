"""Finance reads beyond spend totals (those are in reports.py): tasks with their books,
the tenant budgets' current periods, and the reconciliation report as CSV. The admin API
and the finance dashboard (gateway/ui) both answer from these, so a table on the page
and the admin API's CSV of it are the same rows."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any

from sqlalchemy import Engine, select

from gateway.accounting.money import usd
from gateway.accounting.reconcile_explain import Amounts, Explanation
from gateway.accounting.tables import budgets, tasks

TASK_COLUMNS = ("task_id", "tenant", "opened_at", "deadline_at", "budget_usd", "settled_usd", "held_usd", "remaining_usd",
                "calls_used", "calls_limit", "tokens_used", "tokens_limit")
RECONCILE_COLUMNS = ("upstream", "day", "model", "key_id", "status", "ledger_requests", "provider_requests",
                     "ledger_input_tokens", "provider_input_tokens", "ledger_cached_tokens", "provider_cached_tokens",
                     "ledger_output_tokens", "provider_output_tokens", "ledger_cost_usd", "provider_cost_usd",
                     "difference_usd", "reasons")
MAX_TASKS = 1000


def task_rows(engine: Engine, since: date | None, until: date | None, tenant: str | None = None,
              limit: int = MAX_TASKS) -> list[dict[str, Any]]:
    """Tasks opened in [since, until) (UTC days), newest first, each with its books:
    the task budget's limit, what is settled, what is still held, what is left, and its
    call and token counts."""
    query = (select(tasks.c.id, tasks.c.tenant, tasks.c.created_at, tasks.c.deadline_at, budgets.c.limit_pico,
                    budgets.c.spent_pico, budgets.c.reserved_pico, budgets.c.calls_used, budgets.c.calls_limit,
                    budgets.c.tokens_used, budgets.c.tokens_limit)
             .select_from(tasks.join(budgets, budgets.c.id == tasks.c.budget_id))
             .order_by(tasks.c.created_at.desc(), tasks.c.id).limit(limit))
    if since is not None:
        query = query.where(tasks.c.created_at >= _midnight(since))
    if until is not None:
        query = query.where(tasks.c.created_at < _midnight(until))
    if tenant is not None:
        query = query.where(tasks.c.tenant == tenant)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        {
            "task_id": r.id, "tenant": r.tenant, "opened_at": _iso(r.created_at), "deadline_at": _iso(r.deadline_at),
            "budget_usd": usd(r.limit_pico) if r.limit_pico is not None else None,
            "settled_usd": usd(r.spent_pico), "held_usd": usd(r.reserved_pico),
            "remaining_usd": usd(max(0, r.limit_pico - r.spent_pico - r.reserved_pico)) if r.limit_pico is not None else None,
            "calls_used": r.calls_used, "calls_limit": r.calls_limit, "tokens_used": r.tokens_used, "tokens_limit": r.tokens_limit,
        }
        for r in rows
    ]


def tasks_to_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    return _csv(TASK_COLUMNS, rows)


@dataclass(frozen=True, slots=True)
class BudgetState:
    limit_pico: int | None
    spent_pico: int
    reserved_pico: int

    @property
    def left_pico(self) -> int | None:
        return None if self.limit_pico is None else self.limit_pico - self.spent_pico - self.reserved_pico


def budget_states(engine: Engine, budget_ids: Iterable[str]) -> dict[str, BudgetState]:
    """The budget counters the gateway enforces, by id (`tenant:acme:month:2026-11-01`);
    a budget nobody has drawn on yet has no row."""
    ids = sorted(set(budget_ids))
    if not ids:
        return {}
    query = select(budgets.c.id, budgets.c.limit_pico, budgets.c.spent_pico, budgets.c.reserved_pico).where(budgets.c.id.in_(ids))
    with engine.connect() as conn:
        return {r.id: BudgetState(r.limit_pico, r.spent_pico, r.reserved_pico) for r in conn.execute(query)}


def reconciliation_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per (day, model, key) of a reconciliation report (its `to_json`), each
    difference's reasons in words."""
    out = []
    for row in report["rows"]:
        led, prov = row["ledger"], row["provider"]
        reasons = "; ".join(_describe(reason) for reason in row["reasons"]) or "matched"
        out.append({
            "upstream": report["upstream"], "day": row["day"], "model": row["model"], "key_id": row["key_id"] or "",
            "status": row["status"], "ledger_requests": led["requests"], "provider_requests": prov["requests"],
            "ledger_input_tokens": led["input_tokens"], "provider_input_tokens": prov["input_tokens"],
            "ledger_cached_tokens": led["cached_tokens"], "provider_cached_tokens": prov["cached_tokens"],
            "ledger_output_tokens": led["output_tokens"], "provider_output_tokens": prov["output_tokens"],
            "ledger_cost_usd": led["cost_usd"], "provider_cost_usd": prov["cost_usd"],
            "difference_usd": row["difference"]["cost_usd"], "reasons": reasons,
        })
    return out


def reconciliation_to_csv(report: Mapping[str, Any]) -> str:
    return _csv(RECONCILE_COLUMNS, reconciliation_rows(report))


def _describe(reason: Mapping[str, Any]) -> str:
    amounts = Amounts(reason["requests"], reason["input_tokens"], reason["cached_tokens"], reason["output_tokens"],
                      reason["cost_pico"], reason.get("cache_write_tokens", 0), reason.get("cache_write_1h_tokens", 0))
    return Explanation(reason["reason"], amounts).describe()


def _csv(columns: tuple[str, ...], rows: Iterable[Mapping[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat(timespec="seconds") if moment is not None else None
