"""Group commit: one thread owns ledger writes. Operations queued by concurrent
requests run in one transaction and are committed together (an operation that may be
refused half-way runs inside its own savepoint, so it does not undo the others); every caller waits for the
commit that made its write durable, but not for a lone fsync of its own."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine

log = logging.getLogger("gateway.ledger")
T = TypeVar("T")
MAX_BATCH = 256


@dataclass(slots=True)
class _Op(Generic[T]):
    fn: Callable[[Connection], T]
    future: asyncio.Future[T]
    loop: asyncio.AbstractEventLoop
    isolated: bool


class GroupCommitWriter:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._queue: queue.SimpleQueue[_Op[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="ledger-writer", daemon=True)
        self.batches = 0
        self.ops = 0

    def start(self) -> None:
        self._thread.start()

    async def run(self, fn: Callable[[Connection], T], *, isolated: bool = False) -> T:
        """Run `fn` in the next group commit. `isolated`: `fn` may raise after writing,
        so it gets a savepoint; plain appends skip that cost."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Op(fn, future, loop, isolated))
        # Shielded: a request cancelled mid-write must not lose track of a write that
        # may still commit; the caller's cancellation is re-raised after the commit.
        return await asyncio.shield(future)

    async def stop(self) -> None:
        self._queue.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 30)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    op = self._queue.get_nowait()
                except queue.Empty:
                    break
                if op is None:
                    self._queue.put(None)  # finish this batch, then stop
                    break
                batch.append(op)
            self._commit(batch)

    @staticmethod
    def _apply(conn: Connection, op: _Op[Any]) -> tuple[bool, Any]:
        if op.isolated:
            return _apply_isolated(conn, op)
        # An append that fails would leave the transaction unusable: let it fail the batch.
        return True, op.fn(conn)

    def _commit(self, batch: list[_Op[Any]]) -> None:
        results: list[tuple[bool, Any]] = []
        try:
            with self.engine.begin() as conn:
                for op in batch:
                    results.append(self._apply(conn, op))
        except Exception as exc:  # the commit itself failed: nothing in the batch is durable
            log.exception("ledger commit failed for %d operations", len(batch))
            results = [(False, exc)] * len(batch)
        self.batches += 1
        self.ops += len(batch)
        for op, (ok, value) in zip(batch, results, strict=True):
            op.loop.call_soon_threadsafe(_resolve, op.future, ok, value)


def _apply_isolated(conn: Connection, op: _Op[Any]) -> tuple[bool, Any]:
    savepoint = conn.begin_nested()
    try:
        value = op.fn(conn)
    except Exception as exc:
        savepoint.rollback()
        return False, exc
    savepoint.commit()
    return True, value


def _resolve(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
