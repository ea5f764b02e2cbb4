"""Finance reads on a temporary SQLite ledger: tasks with their books by the month they
were opened in, budget counters, and the reconciliation report as CSV."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway.accounting.database import make_engine, migrate
from gateway.accounting.finance import budget_states, reconciliation_to_csv, task_rows, tasks_to_csv
from gateway.accounting.reconcile import (
    MISSING_AT_GATEWAY,
    UNCONFIRMED,
    Amounts,
    Explanation,
    ReconciliationReport,
    ReconciliationRow,
    Window,
)
from gateway.accounting.tables import budgets, tasks

PICO = 10**12


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}", writer=True)
    migrate(engine)
    return engine


def add_task(engine: Engine, task_id: str, tenant: str, opened: datetime, limit: int | None, spent: int, held: int,
             calls: int = 0) -> None:
    with engine.begin() as conn:
        conn.execute(budgets.insert().values(id=f"task:{task_id}", scope=f"task:{task_id}", period_start="", limit_pico=limit,
                                             reserved_pico=held, spent_pico=spent, calls_limit=10, calls_used=calls,
                                             tokens_limit=None, tokens_reserved=0, tokens_used=calls * 100))
        conn.execute(tasks.insert().values(id=task_id, tenant=tenant, key_id="key_1", budget_id=f"task:{task_id}",
                                           deadline_at=opened + timedelta(hours=1), created_at=opened))


def test_tasks_of_a_month_come_newest_first_with_their_books(engine: Engine) -> None:
    november = datetime(2026, 11, 3, 9, 30, tzinfo=UTC)
    add_task(engine, "task_a", "acme", november, 2 * PICO, PICO // 4, PICO // 10, calls=3)
    add_task(engine, "task_b", "globex", november + timedelta(days=20), None, 7, 0)
    add_task(engine, "task_old", "acme", datetime(2026, 10, 31, 23, 59, tzinfo=UTC), PICO, 0, 0)
    add_task(engine, "task_next", "acme", datetime(2026, 12, 1, 0, 0, tzinfo=UTC), PICO, 0, 0)

    rows = task_rows(engine, date(2026, 11, 1), date(2026, 12, 1))
    assert [r["task_id"] for r in rows] == ["task_b", "task_a"]
    a = rows[1]
    assert (a["tenant"], a["budget_usd"], a["settled_usd"], a["held_usd"], a["remaining_usd"]) == \
        ("acme", "2.000000", "0.250000", "0.100000", "1.650000")
    assert (a["opened_at"], a["deadline_at"], a["calls_used"], a["calls_limit"], a["tokens_used"]) == \
        ("2026-11-03T09:30:00+00:00", "2026-11-03T10:30:00+00:00", 3, 10, 300)
    assert rows[0]["budget_usd"] is None and rows[0]["remaining_usd"] is None
    assert [r["task_id"] for r in task_rows(engine, date(2026, 11, 1), date(2026, 12, 1), "acme")] == ["task_a"]

    parsed = list(csv.DictReader(io.StringIO(tasks_to_csv(rows))))
    assert parsed[1]["remaining_usd"] == "1.650000" and parsed[0]["budget_usd"] == ""


def test_budget_states_say_what_is_left(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(budgets.insert().values(id="tenant:acme:month:2026-11-01", scope="tenant:acme", period_start="2026-11-01",
                                             limit_pico=10 * PICO, reserved_pico=PICO, spent_pico=3 * PICO, calls_used=0,
                                             tokens_reserved=0, tokens_used=0))
    states = budget_states(engine, ["tenant:acme:month:2026-11-01", "tenant:nobody:month:2026-11-01"])
    assert list(states) == ["tenant:acme:month:2026-11-01"]
    assert states["tenant:acme:month:2026-11-01"].left_pico == 6 * PICO
    assert budget_states(engine, []) == {}


def test_a_reconciliation_report_as_csv_names_each_difference_and_its_reasons() -> None:
    day = date(2026, 11, 3)
    matched = ReconciliationRow(day, "gpt-4o-mini", None, Amounts(2, 100, 10, 40, 5000), Amounts(2, 100, 10, 40, 5000), (),
                                {"booked": 2}, True, True)
    explanations = (Explanation(UNCONFIRMED, Amounts(1, 50, 0, 20, 700)), Explanation(MISSING_AT_GATEWAY, Amounts(1, 0, 0, 0, 300)))
    differs = ReconciliationRow(day, "sim-large", "key_x", Amounts(1, 10, 0, 5, 9000), Amounts(3, 60, 0, 25, 10_000),
                                explanations, {"booked": 1, "unconfirmed": 1}, True, True)
    window = Window.of(date(2026, 11, 1), date(2026, 12, 1))
    report = ReconciliationReport("hosted", "OpenAI usage and costs APIs", window, (matched, differs)).to_json()

    rows = list(csv.DictReader(io.StringIO(reconciliation_to_csv(report))))
    assert [(r["model"], r["status"]) for r in rows] == [("gpt-4o-mini", "matched"), ("sim-large", "different")]
    assert rows[0]["reasons"] == "matched" and rows[0]["key_id"] == ""
    other = rows[1]
    assert (other["upstream"], other["day"], other["key_id"], other["ledger_requests"], other["provider_requests"]) == \
        ("hosted", "2026-11-03", "key_x", "1", "3")
    assert (other["ledger_cost_usd"], other["provider_cost_usd"], other["difference_usd"]) == ("0.000000009", "0.00000001", "0.000000001")
    assert other["reasons"] == ("unconfirmed: +1 requests, +50 input, +20 output tokens, +$0.0000000007; "
                                "missing at gateway: +1 requests, +$0.0000000003")
