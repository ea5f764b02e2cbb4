"""The ledger writer on PostgreSQL: savepoints keep a refused hold from undoing the
holds it shares a commit with, holds report their headroom, and a connection the
server kills - idle or mid-batch - is replaced without stopping the writer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text

from gateway.accounting import ledger as ledger_module
from gateway.accounting.database import make_engine, migrate
from gateway.accounting.driver_sql import DriverSql
from gateway.accounting.ledger import HoldRequest, Ledger
from gateway.accounting.writer import GroupCommitWriter, LedgerUnavailable
from gateway.errors import BudgetExceeded
from gateway.types.budget import BudgetClaim, Hold
from tests.conftest import POSTGRES_DSN

NOW = datetime.now(UTC)
WIDE = BudgetClaim("tenant:acme:month:2026-11-01", "tenant:acme", "tenant `acme` budget", "2026-11-01", 1000)
NARROW = BudgetClaim("task:t1", "task:t1", "task `t1`", "", 100)


def request(n: int, amount: int) -> HoldRequest:
    return HoldRequest(request_id=f"req_{n}", tenant="acme", key_id="key_1", task_id=None, model="gpt-4o-mini",
                       upstream_model="gpt-4o-mini", upstream="hosted", endpoint="chat", amount_pico=amount, tokens=10,
                       prompt_tokens_est=5, expires_at=NOW + timedelta(seconds=60), now=NOW)


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    engine = make_engine(postgres_url, writer=True)
    migrate(engine)
    yield engine
    engine.dispose()


def kill_other_sessions(postgres_url: str) -> None:
    with psycopg.connect(f"{POSTGRES_DSN}/test", autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                      (postgres_url.rsplit("/", 1)[1],))


@pytest.mark.services
def test_a_refused_hold_undoes_only_itself_and_holds_report_headroom(engine: Engine) -> None:
    async def main() -> list[Any]:
        writer = GroupCommitWriter(engine)
        ledger = Ledger(writer)
        tasks = [asyncio.create_task(ledger.reserve(request(n, amount), [WIDE, NARROW])) for n, amount in ((1, 60), (2, 50), (3, 40))]
        await asyncio.sleep(0)  # all queued before the writer starts: one batch, one savepoint each
        writer.start()
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert writer.batches == 1
        finally:
            await writer.stop()
        return results

    first, refused, third = asyncio.run(main())
    assert isinstance(first, Hold) and isinstance(third, Hold) and isinstance(refused, BudgetExceeded)
    assert (first.headroom_pico, third.headroom_pico) == (40, 0)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, reserved_pico, calls_used FROM budgets ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [(NARROW.budget_id, 100, 2), (WIDE.budget_id, 100, 2)]


@pytest.mark.services
def test_killed_connections_are_replaced(engine: Engine, postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    def mark(n: int) -> Any:
        return lambda sql: sql.execute("INSERT INTO schema_version (version, applied_at) VALUES (:v, :at)", {"v": n, "at": NOW})

    def killed_mid_batch(sql: DriverSql) -> int:
        return sql.execute("SELECT pg_terminate_backend(pg_backend_pid())", {})

    async def main() -> None:
        writer = GroupCommitWriter(engine)
        writer.start()
        try:
            await writer.run(mark(101))
            kill_other_sessions(postgres_url)  # the writer's connection dies while idle
            await writer.run(mark(102))
            with pytest.raises(LedgerUnavailable):
                await writer.run(killed_mid_batch, isolated=True)
            await writer.run(mark(103))
        finally:
            await writer.stop()

    asyncio.run(main())
    assert "lost while idle" in caplog.text, "the idle kill was noticed at BEGIN and retried"
    with engine.connect() as conn:
        done = {v for (v,) in conn.execute(text("SELECT version FROM schema_version WHERE version > 100"))}
    assert done == {101, 102, 103}


@pytest.mark.services
def test_single_budget_holds_and_settlements_stay_exact_in_one_round_trip_each(engine: Engine) -> None:
    # The common case - one budget - takes PostgreSQL's one-statement path: the first
    # hold creates the budget, a refused hold leaves no reservation behind, and a hold
    # settles exactly once.
    async def main() -> tuple[Any, ...]:
        writer = GroupCommitWriter(engine)
        writer.start()
        ledger = Ledger(writer)
        try:
            first = await ledger.reserve(request(1, 600), [WIDE])
            second = await ledger.reserve(request(2, 300), [WIDE])
            refused = await asyncio.gather(ledger.reserve(request(3, 200), [WIDE]), return_exceptions=True)
            call = dict(request_id="req_1", reservation_id=first.id, tenant="acme", key_id="key_1", endpoint="chat",
                        model="gpt-4o-mini", upstream="hosted", status="ok", usage_known=True, prompt_tokens=5,
                        completion_tokens=2, cost_pico=250, created_at=NOW, day=NOW.date().isoformat())
            settled = await ledger.settle([first], 250, 7, [call], NOW)
            again = await ledger.settle([first], 250, 7, [], NOW)
            return first, second, refused[0], settled, again
        finally:
            await writer.stop()

    first, second, refused, settled, again = asyncio.run(main())
    assert (first.headroom_pico, second.headroom_pico) == (400, 100)
    assert isinstance(refused, BudgetExceeded)
    assert (settled, again) == (True, False)
    with engine.connect() as conn:
        holds = dict(conn.execute(text("SELECT request_id, state FROM reservations")).all())
        money = conn.execute(text("SELECT reserved_pico, spent_pico, tokens_reserved, tokens_used, calls_used FROM budgets")).one()
        booked = conn.execute(text("SELECT request_id, reservation_id, cost_pico FROM usage_events")).all()
    assert [tuple(b) for b in booked] == [("req_1", first.id, 250)]
    assert holds == {"req_1": "settled", "req_2": "reserved"}  # nothing left of the refused one
    assert tuple(money) == (300, 250, 10, 7, 2)  # the settled hold moved to spent once; the open one still held


def booking(n: int, hold: Hold, cost: int) -> dict[str, Any]:
    return dict(request_id=f"req_{n}", attempt=1, reservation_id=hold.id, tenant="acme", key_id="key_1", endpoint="chat",
                model="gpt-4o-mini", upstream="hosted", status="ok", usage_known=True, prompt_tokens=5, completion_tokens=2,
                cost_pico=cost, created_at=NOW, day=NOW.date().isoformat())


@pytest.mark.services
def test_a_batch_sent_in_one_round_trip_keeps_every_hold_and_settlement_exact(engine: Engine) -> None:
    # Queued before the writer starts, each group is one batch, its statements sent
    # together: a refusal, a budget's first hold and settlements ahead of a hold must
    # come out as if they had run one by one, in order.
    new = BudgetClaim("tenant:new:month:2026-11-01", "tenant:new", "tenant `new` budget", "2026-11-01", 50)

    async def main() -> tuple[list[Any], list[Any], int]:
        writer = GroupCommitWriter(engine)
        ledger = Ledger(writer)
        first = [asyncio.create_task(ledger.reserve(request(n, amount), [claim]))
                 for n, amount, claim in ((1, 600, WIDE), (2, 300, WIDE), (3, 200, WIDE), (4, 40, new))]
        await asyncio.sleep(0)
        writer.start()
        try:
            holds = await asyncio.gather(*first, return_exceptions=True)
            one, two = holds[0], holds[1]
            assert isinstance(one, Hold) and isinstance(two, Hold)
            await writer.flush()
            second = [asyncio.create_task(ledger.settle([one], 250, 7, [booking(1, one, 250)], NOW)),
                      asyncio.create_task(ledger.settle([two], 0, 0, [booking(2, two, 0)], NOW)),
                      asyncio.create_task(ledger.reserve(request(5, 700), [WIDE]))]
            await asyncio.sleep(0)
            return holds, await asyncio.gather(*second, return_exceptions=True), writer.batches
        finally:
            await writer.stop()

    holds, later, batches = asyncio.run(main())
    assert [h.headroom_pico if isinstance(h, Hold) else type(h) for h in holds] == [400, 100, BudgetExceeded, 10]
    assert later[:2] == [True, True]
    assert isinstance(later[2], Hold) and later[2].headroom_pico == 50  # the settlements ahead of it had freed the room
    # The holds (committed in their round trip; the refused one and the new budget's
    # first hold, which wrote nothing there, again on their own), the flush, then the
    # settlements and hold together.
    assert batches == 4
    with engine.connect() as conn:
        states = dict(conn.execute(text("SELECT request_id, state FROM reservations")).all())
        money = {r[0]: tuple(r[1:]) for r in conn.execute(text("SELECT id, reserved_pico, spent_pico, calls_used FROM budgets"))}
        booked = sorted(r[0] for r in conn.execute(text("SELECT request_id FROM usage_events")))
    assert states == {"req_1": "settled", "req_2": "released", "req_4": "reserved", "req_5": "reserved"}
    assert money == {WIDE.budget_id: (700, 250, 3), new.budget_id: (40, 0, 1)}
    assert booked == ["req_1", "req_2"]


@pytest.mark.services
def test_a_batch_of_holds_and_settlements_releases_the_budget_row_before_its_results_are_read(
    engine: Engine, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Replicas share a tenant's budget row. If a batch's COMMIT waited for this process
    # to read its results (and for this thread to get the GIL back), every other
    # replica's hold would wait on the row's lock meanwhile.
    seen: list[str] = []
    real_ended = ledger_module._ended

    def probing_ended(sql: DriverSql, row: Any) -> bool:
        with psycopg.connect(postgres_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as other:
            try:
                other.execute("SELECT 1 FROM budgets WHERE id = %s FOR UPDATE NOWAIT", (WIDE.budget_id,))
                seen.append("free")
            except psycopg.errors.LockNotAvailable:
                seen.append("locked")
        return real_ended(sql, row)

    async def main() -> bool:
        writer = GroupCommitWriter(engine)
        ledger = Ledger(writer)
        writer.start()
        try:
            hold = await ledger.reserve(request(1, 600), [WIDE])
            monkeypatch.setattr(ledger_module, "_ended", probing_ended)
            return await ledger.settle([hold], 250, 7, [booking(1, hold, 250)], NOW)
        finally:
            await writer.stop()

    assert asyncio.run(main()) is True
    assert seen == ["free"]
    with engine.connect() as conn:
        assert tuple(conn.execute(text("SELECT reserved_pico, spent_pico FROM budgets")).one()) == (0, 250)
