"""The group-commit writer on a temporary SQLite ledger: what one batch commits when an
operation in it fails, and how the writer carries on when its connection breaks."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, create_engine, text

from gateway.accounting.database import make_engine
from gateway.accounting.driver_sql import DriverSql
from gateway.accounting.writer import GroupCommitWriter, LedgerUnavailable

T = TypeVar("T")
INSERT = "INSERT INTO marks (v) VALUES (:v)"


def mark(v: int) -> Callable[[DriverSql], int]:
    return lambda sql: sql.execute(INSERT, {"v": v})


def mark_then_fail(v: int, error: Exception) -> Callable[[DriverSql], int]:
    def op(sql: DriverSql) -> int:
        sql.execute(INSERT, {"v": v})
        raise error

    return op


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}", writer=True)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE marks (v INTEGER NOT NULL)"))
    return engine


def marks(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return sorted(v for (v,) in conn.execute(text("SELECT v FROM marks")))


def with_writer(engine: Engine, body: Callable[[GroupCommitWriter], Awaitable[T]]) -> T:
    async def main() -> T:
        writer = GroupCommitWriter(engine)
        writer.start()
        try:
            return await body(writer)
        finally:
            await writer.stop()

    return asyncio.run(main())


async def one_batch(writer: GroupCommitWriter, *calls: Coroutine[Any, Any, Any]) -> list[Any]:
    """Queue every call before the writer starts, so they share one commit."""
    tasks = [asyncio.create_task(c) for c in calls]
    await asyncio.sleep(0)  # each task queues its operation
    writer.start()
    return await asyncio.gather(*tasks, return_exceptions=True)


def batched(engine: Engine, make_calls: Callable[[GroupCommitWriter], list[Coroutine[Any, Any, Any]]]) -> tuple[list[Any], int]:
    async def main() -> tuple[list[Any], int]:
        writer = GroupCommitWriter(engine)
        try:
            results = await one_batch(writer, *make_calls(writer))
        finally:
            await writer.stop()
        return results, writer.batches

    return asyncio.run(main())


def test_a_failed_isolated_operation_is_undone_alone(engine: Engine) -> None:
    refused = ValueError("refused half-way")
    results, batches = batched(engine, lambda w: [
        w.run(mark(1)), w.run(mark_then_fail(2, refused), isolated=True), w.run(mark(3), isolated=True)])
    assert batches == 1
    assert results == [1, refused, 1]
    assert marks(engine) == [1, 3]


def test_a_lone_isolated_operation_that_fails_leaves_nothing(engine: Engine) -> None:
    async def body(writer: GroupCommitWriter) -> None:
        with pytest.raises(ValueError):
            await writer.run(mark_then_fail(1, ValueError("no")), isolated=True)
        await writer.run(mark(2))

    with_writer(engine, body)
    assert marks(engine) == [2]


def test_a_failing_append_fails_its_batch_and_keeps_its_own_error(engine: Engine) -> None:
    results, _ = batched(engine, lambda w: [w.run(mark(1)), w.run(mark_then_fail(2, KeyError("model")))])
    assert isinstance(results[0], LedgerUnavailable), "the innocent write learns the batch was lost"
    assert isinstance(results[1], KeyError)
    assert marks(engine) == []

    with_writer(engine, lambda w: w.run(mark(4)))
    assert marks(engine) == [4]


def test_database_errors_become_ledger_unavailable(engine: Engine) -> None:
    async def body(writer: GroupCommitWriter) -> None:
        with pytest.raises(LedgerUnavailable) as raised:
            await writer.run(lambda sql: sql.execute("INSERT INTO no_such_table (v) VALUES (1)", {}), isolated=True)
        assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
        await writer.run(mark(1))

    with_writer(engine, body)
    assert marks(engine) == [1]


def test_a_connection_closed_while_idle_is_replaced_without_failing_a_write(engine: Engine) -> None:
    async def body(writer: GroupCommitWriter) -> None:
        await writer.run(mark(1))
        assert writer._conn is not None
        writer._conn.raw.close()  # what a server restart does to an idle connection
        await writer.run(mark(2))

    with_writer(engine, body)
    assert marks(engine) == [1, 2]


def test_a_connection_that_breaks_mid_batch_fails_the_batch_then_the_writer_reconnects(engine: Engine) -> None:
    async def main() -> None:
        writer = GroupCommitWriter(engine)

        def break_then_write(sql: DriverSql) -> int:
            assert writer._conn is not None
            writer._conn.raw.close()  # the connection dies under the running batch
            return sql.execute(INSERT, {"v": 2})

        try:
            failed = await one_batch(writer, writer.run(mark(1)), writer.run(break_then_write, isolated=True), writer.run(mark(3)))
            assert writer.batches == 1
            assert all(isinstance(f, LedgerUnavailable) for f in failed), failed
            await writer.run(mark(4))
        finally:
            await writer.stop()

    asyncio.run(main())
    assert marks(engine) == [4]


def test_an_unreachable_database_fails_writes_and_the_writer_keeps_going(tmp_path: Path) -> None:
    (tmp_path / "a-directory.db").mkdir()  # sqlite cannot open a directory as a database
    engine = create_engine(f"sqlite:///{tmp_path / 'a-directory.db'}")

    async def body(writer: GroupCommitWriter) -> int:
        for _ in range(2):
            with pytest.raises(LedgerUnavailable):
                await writer.run(mark(1))
        return writer.batches

    assert with_writer(engine, body) == 2


def test_stop_closes_the_connection(engine: Engine) -> None:
    async def body(writer: GroupCommitWriter) -> Any:
        await writer.run(mark(1))
        assert writer._conn is not None
        return writer._conn.raw

    raw = with_writer(engine, body)
    with pytest.raises(sqlite3.ProgrammingError):
        raw.execute("SELECT 1")
    engine.dispose()


def test_a_write_nobody_waits_on_shares_the_next_waited_write_commit(engine: Engine) -> None:
    """A settlement (lazy) queued alone waits for the next hold and rides its commit:
    one commit - one fsync - for both."""

    async def body(writer: GroupCommitWriter) -> int:
        writer.linger_s = 5.0  # far longer than the test needs: the hold ends the wait, not the clock
        settle = asyncio.ensure_future(writer.run(mark(1), lazy=True))
        await asyncio.sleep(0)  # queued first, alone
        before = writer.batches
        await writer.run(mark(2))
        await settle
        return writer.batches - before

    assert with_writer(engine, body) == 1
    assert marks(engine) == [1, 2]


def test_a_lone_lazy_write_is_committed_after_the_linger(engine: Engine) -> None:
    async def body(writer: GroupCommitWriter) -> None:
        writer.linger_s = 0.01
        await writer.run(mark(7), lazy=True)

    with_writer(engine, body)
    assert marks(engine) == [7]


def test_flush_returns_once_earlier_lazy_writes_are_committed(engine: Engine) -> None:
    async def body(writer: GroupCommitWriter) -> list[int]:
        writer.linger_s = 5.0
        pending = asyncio.ensure_future(writer.run(mark(3), lazy=True))
        await asyncio.sleep(0)
        await writer.flush()
        assert pending.done()
        return marks(engine)

    assert with_writer(engine, body) == [3]


def test_an_operation_that_fails_mid_read_leaves_the_ledger_writable(engine: Engine) -> None:
    """A bug in one operation (not the database) that leaves a read unfinished must not
    leave SQLite's write lock behind: the next writes commit as usual."""

    def read_then_fail(sql: DriverSql) -> None:
        sql.execute(INSERT, {"v": 1})
        sql.execute(INSERT, {"v": 2})
        sql.fetchone("SELECT v FROM marks", {})  # one row of two: the statement is unfinished
        raise OverflowError("a value the driver cannot take")

    async def body(writer: GroupCommitWriter) -> None:
        with pytest.raises(OverflowError):
            await writer.run(read_then_fail)
        await writer.run(mark(3))

    with_writer(engine, body)
    assert marks(engine) == [3]
