"""Reserve and settle on a temporary SQLite ledger: a refused hold undoes only itself
even when it shares a commit with others, and every hold reports the room its
budgets have left."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, text

from gateway.accounting.database import make_engine, migrate
from gateway.accounting.ledger import HoldRequest, Ledger
from gateway.accounting.writer import GroupCommitWriter
from gateway.errors import BudgetExceeded
from gateway.types.budget import BudgetClaim, Hold

T = TypeVar("T")
NOW = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)
WIDE = BudgetClaim("tenant:acme:month:2026-11-01", "tenant:acme", "tenant `acme` budget", "2026-11-01", 1000)
NARROW = BudgetClaim("task:t1", "task:t1", "task `t1`", "", 100)
UNLIMITED = BudgetClaim("tenant:free::", "tenant:free", "tenant `free` budget")


def request(n: int, amount: int) -> HoldRequest:
    return HoldRequest(request_id=f"req_{n}", tenant="acme", key_id="key_1", task_id=None, model="gpt-4o-mini",
                       upstream_model="gpt-4o-mini", upstream="hosted", endpoint="chat", amount_pico=amount, tokens=10,
                       prompt_tokens_est=5, expires_at=NOW + timedelta(seconds=60), now=NOW)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}", writer=True)
    migrate(engine)
    return engine


def with_ledger(engine: Engine, body: Callable[[Ledger], Awaitable[T]], *, batch_first: bool = False,
                kind: type[Ledger] = Ledger) -> T:
    async def main() -> T:
        writer = GroupCommitWriter(engine)
        if not batch_first:
            writer.start()
        try:
            return await body(kind(writer))
        finally:
            await writer.stop()

    return asyncio.run(main())


def budget(engine: Engine, budget_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(text("SELECT reserved_pico, calls_used FROM budgets WHERE id = :id"), {"id": budget_id}).one()


def test_a_refused_hold_undoes_only_itself_within_a_shared_commit(engine: Engine) -> None:
    async def body(ledger: Ledger) -> list[Any]:
        claims = [WIDE, NARROW]
        # The second request fits WIDE but not NARROW: its hold on WIDE must be undone.
        tasks = [asyncio.create_task(ledger.reserve(request(n, amount), claims)) for n, amount in ((1, 60), (2, 50), (3, 40))]
        await asyncio.sleep(0)  # all three are queued before the writer starts: one batch
        ledger.writer.start()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert ledger.writer.batches == 1
        return results

    first, refused, third = with_ledger(engine, body, batch_first=True)
    assert isinstance(first, Hold) and isinstance(third, Hold)
    assert isinstance(refused, BudgetExceeded) and "task `t1`" in str(refused)
    assert tuple(budget(engine, WIDE.budget_id)) == (100, 2)
    assert tuple(budget(engine, NARROW.budget_id)) == (100, 2)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM reservations")).scalar_one() == 2


@pytest.mark.parametrize("returning", [True, False], ids=["update-returning", "select-after"])
def test_headroom_is_the_least_left_over_money_limited_claims(engine: Engine, returning: bool) -> None:
    engine.dialect.update_returning = returning  # SQLite before 3.35 has no RETURNING

    async def body(ledger: Ledger) -> list[int | None]:
        first = await ledger.reserve(request(1, 60), [WIDE, NARROW, UNLIMITED])
        unlimited = await ledger.reserve(request(2, 5), [UNLIMITED])
        await ledger.settle([first], 30, 10, [], NOW)  # 30 spent, the other 30 released
        second = await ledger.reserve(request(3, 10), [WIDE, NARROW])
        alone = await ledger.reserve(request(4, 900), [WIDE])
        return [first.headroom_pico, unlimited.headroom_pico, second.headroom_pico, alone.headroom_pico]

    assert with_ledger(engine, body) == [100 - 60, None, 100 - 30 - 10, 1000 - 30 - 10 - 900]


def test_an_expired_hold_is_booked_with_the_table_defaults(engine: Engine) -> None:
    async def body(ledger: Ledger) -> int:
        await ledger.reserve(request(1, 70), [WIDE])
        assert await ledger.expire_orphans(NOW) == 0, "not expired yet"
        return await ledger.expire_orphans(NOW + timedelta(hours=1))

    assert with_ledger(engine, body) == 1
    with engine.connect() as conn:
        event = conn.execute(text("SELECT * FROM usage_events")).one()
        hold = conn.execute(text("SELECT state, settled_pico, created_at FROM reservations")).one()
        spent = conn.execute(text("SELECT reserved_pico, spent_pico FROM budgets")).one()
    assert (event.status, event.cost_pico, event.attempt, event.usage_known) == ("unconfirmed", 70, 0, 0)
    assert (event.saved_pico, event.prompt_tokens, event.timeline, event.replica) == (0, 0, "{}", None)
    assert event.created_at == hold.created_at == "2026-11-29 12:00:00.123456", "stored as the ORM stores datetimes"
    assert event.day == "2026-11-29"
    assert (hold.state, hold.settled_pico) == ("expired", 70)
    assert tuple(spent) == (0, 70)


def test_a_ledger_file_locked_by_another_process_refuses_holds_soon_and_recovers(engine: Engine, tmp_path: Path) -> None:
    """Another process holding SQLite's write lock (a stray second gateway on the same
    file, a backup tool) must not hang every request for half a minute: holds are
    refused with 503 `not ready` within the writer's lock wait, and go through again
    once the lock is released."""
    import sqlite3
    import time

    from gateway.accounting.database import WRITER_LOCK_WAIT_S
    from gateway.errors import NotReady

    other = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")

    async def body(ledger: Ledger) -> float:
        started = time.monotonic()
        with pytest.raises(NotReady, match="the ledger database is unreachable"):
            await ledger.reserve(request(1, 100), [WIDE])
        waited = time.monotonic() - started
        other.execute("ROLLBACK")
        await ledger.reserve(request(2, 100), [WIDE])
        return waited

    waited = with_ledger(engine, body)
    other.close()
    # The old 30 s wait (60 s with the reconnect) is what this guards against.
    assert waited < 4 * WRITER_LOCK_WAIT_S
    assert tuple(budget(engine, WIDE.budget_id)) == (100, 1)
