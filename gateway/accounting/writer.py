"""Group commit: one thread owns ledger writes. Operations queued by concurrent
requests run in one transaction and are committed together (an operation that may be
refused half-way runs inside its own savepoint, so it does not undo the others); every
caller waits for the commit that made its write durable, but not for a lone fsync of
its own.

The thread keeps one DBAPI connection of its own, outside SQLAlchemy's pool, and
drives transactions with plain SQL: per batch that is BEGIN, the statements, COMMIT -
none of the pool checkout, Connection and Transaction objects and events that cost
more CPU than the statements themselves. On PostgreSQL a batch of one-statement
operations sends its statements and COMMIT in one round trip, so that the locks they
take (a shared budget row's) are not held while this thread waits for the GIL. A
connection that breaks is thrown away and the next batch opens a fresh one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from gateway.accounting.database import begin_statement
from gateway.accounting.driver_sql import DriverSql, Staged
from gateway.telemetry.outage import OutageLog

log = logging.getLogger("gateway.ledger")
T = TypeVar("T")
MAX_BATCH = 256
# How long a batch of writes nobody waits on (settlements of answered calls) may wait
# for a write somebody does wait on (a hold), to share its commit - and its fsync.
LINGER_S = 0.005
SAVEPOINT = "ledger_op"


class WriteRefused(Exception):
    """Raised by an operation that refuses before writing anything that would need
    undoing: it ends that operation only, and needs no savepoint."""


class LedgerUnavailable(Exception):
    """The ledger database did not take the write: unreachable, gone, or the connection
    broke. The write is not in the books (if the connection broke during COMMIT, the
    database alone knows). Errors an operation raises on purpose pass through as they are."""


@dataclass(slots=True)
class _Op(Generic[T]):
    fn: Callable[[DriverSql], T]
    future: asyncio.Future[T]
    loop: asyncio.AbstractEventLoop
    isolated: bool
    lazy: bool = False
    staged: Staged[T] | None = None


class _Connection:
    """The writer thread's connection, with transactions it starts and ends itself."""

    def __init__(self, engine: Engine) -> None:
        pooled = engine.raw_connection()  # through the pool, so connect-time setup (SQLite pragmas) applies
        raw = pooled.driver_connection
        assert raw is not None
        pooled.detach()  # ours for good: the pool forgets it, and we close it ourselves
        self.raw: Any = raw
        try:
            raw.rollback()  # leave whatever the dialect's first-connect queries began
            if engine.dialect.name == "sqlite":
                raw.isolation_level = None  # the sqlite3 module must not open transactions behind our back
            else:
                raw.autocommit = True  # psycopg: BEGIN is ours to send, not implicit
            self._control = raw.cursor()
            self.sql = DriverSql.on(raw, engine.dialect)
        except Exception:
            self.close()
            raise
        self._begin = begin_statement(engine.dialect.name, writer=True)

    def _run(self, statement: str) -> None:
        self._control.execute(statement)

    def begin(self) -> None:
        self._run(self._begin)

    def commit(self) -> None:
        self._run("COMMIT")

    def rollback(self) -> None:
        self._run("ROLLBACK")

    def savepoint(self) -> None:
        self._run(f"SAVEPOINT {SAVEPOINT}")

    def release(self) -> None:
        self._run(f"RELEASE SAVEPOINT {SAVEPOINT}")

    def rollback_to(self) -> None:
        self._run(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
        self.release()  # ROLLBACK TO keeps the savepoint open; don't let refusals pile them up

    def close(self) -> None:
        # Roll back and close the cursors first: SQLite keeps its write lock while a failed
        # statement is left unfinished, even past close(), and every later write would wait.
        for step in (self._control.close, self.sql.close, self.raw.rollback, self.raw.close):
            with contextlib.suppress(Exception):  # it may be broken already; either way it is gone
                step()


class GroupCommitWriter:
    def __init__(self, engine: Engine, linger_s: float = LINGER_S) -> None:
        self.engine = engine
        self.linger_s = linger_s
        self._queue: queue.SimpleQueue[_Op[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="ledger-writer", daemon=True)
        self._conn: _Connection | None = None  # the writer thread's alone
        self._driver_errors: tuple[type[BaseException], ...] = (engine.dialect.loaded_dbapi.Error, SQLAlchemyError)
        # Statements are round trips to a server (PostgreSQL), as for `DriverSql.one_trip`:
        # operations then offer their one-statement `staged` form.
        self.one_trip = engine.dialect.name != "sqlite"
        self.batches = 0
        self.ops = 0
        self.outage = OutageLog(log, "ledger database")  # one line per change of state, a summary while down

    def start(self) -> None:
        self._thread.start()

    async def run(self, fn: Callable[[DriverSql], T], *, isolated: bool = False, lazy: bool = False,
                  staged: Staged[T] | None = None) -> T:
        """Run `fn` in the next group commit. `isolated`: `fn` may raise after writing,
        so it gets a savepoint; plain appends skip that cost. `lazy`: nobody is waiting
        on this write, so it may wait up to `linger_s` to share a later write's commit.
        `staged`: what `fn` does where statements are round trips (PostgreSQL), as one
        statement the batch can send with the others. Raises LedgerUnavailable when the
        database did not take the write."""
        # Shielded: a request cancelled mid-write must not lose track of a write that
        # may still commit; the caller's cancellation is re-raised after the commit.
        return await asyncio.shield(self.submit(fn, isolated=isolated, lazy=lazy, staged=staged))

    def submit(self, fn: Callable[[DriverSql], T], *, isolated: bool = False, lazy: bool = False,
               staged: Staged[T] | None = None) -> asyncio.Future[T]:
        """Queue `fn` as `run` does, and return at once: the future resolves once it is
        committed, or fails as `run` would raise. For writes nobody waits on, so they
        are queued in the same turn of the event loop, with no task of their own."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Op(fn, future, loop, isolated, lazy, staged))
        return future

    async def flush(self) -> None:
        """Returns once every write queued before it is committed (or has failed)."""
        if self._thread.is_alive():  # not started (or already stopped): nothing can be pending
            await self.run(_nothing)

    async def stop(self) -> None:
        """Finish the queued writes, then close the connection."""
        self._queue.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 30)

    def _loop(self) -> None:
        try:
            while (batch := self._next_batch()) is not None:
                self._commit(batch)
        finally:
            self._discard()

    def _next_batch(self) -> list[_Op[Any]] | None:
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        if not self._gather(batch, block=False) and all(op.lazy for op in batch):
            # Nobody waits on these: give a hold a moment to arrive and share the fsync.
            self._gather(batch, block=True)
        return batch

    def _gather(self, batch: list[_Op[Any]], *, block: bool) -> bool:
        """Add queued ops to `batch`; True if the writer is stopping. Blocking: wait (up
        to `linger_s` in all) until an op somebody waits on has joined."""
        deadline = time.monotonic() + self.linger_s
        while len(batch) < MAX_BATCH:
            try:
                op = self._queue.get(timeout=max(0.0, deadline - time.monotonic())) if block else self._queue.get_nowait()
            except queue.Empty:
                return False
            if op is None:
                self._queue.put(None)  # finish this batch, then stop
                return True
            batch.append(op)
            if block and not op.lazy:
                return self._gather(batch, block=False)
        return False

    def _commit(self, batch: list[_Op[Any]]) -> None:
        culprit: _Op[Any] | None = None
        again: list[_Op[Any]] = []
        try:
            conn = self._begin()
            staged, committed = self._apply_staged(conn, batch)
            if committed:
                # Durable already. An operation its one statement left undone (it wrote
                # nothing: see Staged.more) runs again, in full, in a transaction of its own.
                finished = [(op, done) for op, done in zip(batch, staged, strict=True) if done is not None]
                again = [replace(op, staged=None) for op, done in zip(batch, staged, strict=True) if done is None]
            else:
                finished = []
                for op, done in zip(batch, staged, strict=True):
                    if done is None:
                        culprit = op
                        done = self._apply(conn, op, savepoint=len(batch) > 1)
                    finished.append((op, done))
                culprit = None
                if any(ok for _, (ok, _) in finished):
                    conn.commit()
                else:  # a lone operation that failed: nothing to keep
                    conn.rollback()
        except Exception as exc:  # nothing in the batch is durable
            self._discard()  # its state is unknown; closing it rolls back whatever is open
            own = culprit is not None and not isinstance(exc, self._driver_errors)  # a bug in one op, not the database
            if own:
                log.exception("ledger commit failed for %d operations", len(batch))
            else:
                self.outage.failed(exc, "failed commits")
            finished = [(op, (False, exc if own and op is culprit else self._unavailable(exc))) for op in batch]
        else:
            self.outage.recovered()
        self.batches += 1
        self.ops += len(finished)
        for op, (ok, value) in finished:
            op.loop.call_soon_threadsafe(_resolve, op.future, ok, value)
        if again:
            self._commit(again)

    def _begin(self) -> _Connection:
        if self._conn is not None:
            try:
                self._conn.begin()
                return self._conn
            except self._driver_errors:
                # Closed while idle (a server restart, a proxy's timeout): nothing has run
                # yet, so start over on a fresh connection rather than fail the batch.
                log.warning("ledger connection was lost while idle; reconnecting", exc_info=True)
                self._discard()
        self._conn = _Connection(self.engine)
        self._conn.begin()
        return self._conn

    def _apply_staged(self, conn: _Connection, batch: list[_Op[Any]]) -> tuple[list[tuple[bool, Any] | None], bool]:
        """Where statements are round trips, send the staged operations' statements in
        one, then finish each in batch order; the rest (None here) run one by one.
        When every operation in the batch is staged, COMMIT goes in that same round trip
        (True returned): no lock a statement takes (a budget row's, above all) is then
        held while this thread waits for the GIL. An operation whose row leaves more to
        do (None here) has written nothing, and is run again by the caller."""
        results: list[tuple[bool, Any] | None] = [None] * len(batch)
        if not conn.sql.pipelines:
            return results, False
        staged = [(i, op.staged) for i, op in enumerate(batch) if op.staged is not None and not op.isolated]
        whole = len(staged) == len(batch)
        if len(staged) < 2 and not whole:
            return results, False
        rows = conn.sql.fetch_each([(one.sql, one.params) for _, one in staged], commit=whole)
        for (i, one), row in zip(staged, rows, strict=True):
            if whole and one.more(row):
                continue
            try:
                results[i] = True, one.finish(conn.sql, row)
            except WriteRefused as refused:
                results[i] = False, refused
            except Exception as exc:
                if not whole:
                    raise  # like `_apply`: any other error fails the batch, which is not committed
                log.exception("a committed ledger operation failed to finish")  # a bug: the write stands
                results[i] = False, exc
        return results, whole

    def _apply(self, conn: _Connection, op: _Op[Any], *, savepoint: bool) -> tuple[bool, Any]:
        if not op.isolated:
            # An append that fails would leave the transaction unusable: let it fail the batch.
            try:
                return True, op.fn(conn.sql)
            except WriteRefused as refused:
                return False, refused
        if savepoint:
            conn.savepoint()
        try:
            value = op.fn(conn.sql)
        except Exception as exc:
            if savepoint:
                conn.rollback_to()  # if this fails too, the connection is gone: the batch fails
            return False, self._unavailable(exc) if isinstance(exc, self._driver_errors) else exc
        if savepoint:
            conn.release()
        return True, value

    def _unavailable(self, exc: Exception) -> LedgerUnavailable:
        if isinstance(exc, LedgerUnavailable):
            return exc
        error = LedgerUnavailable(f"{type(exc).__name__}: {exc}"[:500])
        error.__cause__ = exc
        return error

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _nothing(sql: DriverSql) -> None:
    return None


def _resolve(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
