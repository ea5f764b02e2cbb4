"""When a hold may be sized from the prompt's bound: only for money budgets known to
have room for many such holds."""

from __future__ import annotations

from gateway.accounting.headroom import Headroom
from gateway.types.budget import BudgetClaim

TENANT = BudgetClaim("tenant:acme:month:2026-11-01", "tenant:acme", "tenant `acme` budget", "2026-11-01", 10**12)
TASK = BudgetClaim("task:t1", "task:t1", "task `t1`")


def test_unknown_budgets_are_never_ample() -> None:
    assert not Headroom().ample([TENANT], 1)


def test_ample_means_room_for_that_many_holds() -> None:
    room = Headroom(ample_holds=1000)
    room.record(TENANT.budget_id, 1_000_000)
    assert room.ample([TENANT], 1_000)
    assert not room.ample([TENANT], 1_001)


def test_task_budgets_always_count() -> None:
    room = Headroom()
    room.record(TASK.budget_id, 10**15)
    room.record(TENANT.budget_id, 10**15)
    assert not room.ample([TENANT, TASK], 1)


def test_forgotten_and_unlimited_budgets_are_unknown_again() -> None:
    room = Headroom()
    room.record(TENANT.budget_id, 10**15)
    room.forget([TENANT])
    assert not room.ample([TENANT], 1)
    room.record(TENANT.budget_id, 10**15)
    room.record(TENANT.budget_id, None)
    assert not room.ample([TENANT], 1)
