"""Opening the ledger: a SQLite ledger that another process is writing to (the first of
several workers creating it) is opened, in WAL mode, once that process lets go, rather
than failing the gateway's start-up."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from sqlalchemy import text

from gateway.accounting.database import make_engine


def test_a_ledger_another_connection_is_writing_is_opened_in_wal_mode_once_it_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE first_worker (x)")  # not in WAL mode yet: a new ledger
    holder.execute("BEGIN IMMEDIATE")  # another process writing: the switch to WAL fails at once
    holder.execute("INSERT INTO first_worker VALUES (1)")
    released: list[float] = []

    def let_go() -> None:
        holder.execute("COMMIT")
        released.append(time.monotonic())

    timer = threading.Timer(0.2, let_go)
    engine = make_engine(f"sqlite:///{path}", writer=True)
    started = time.monotonic()
    timer.start()
    try:
        with engine.connect() as conn:
            opened = time.monotonic()
            mode = conn.execute(text("PRAGMA journal_mode")).scalar_one()
    finally:
        timer.join()
        engine.dispose()
        holder.close()
    assert started < released[0] <= opened, "the connection was opened while the other one still held its lock"
    assert mode == "wal"
