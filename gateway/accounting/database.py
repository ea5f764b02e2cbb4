"""Engine creation (SQLite by default, PostgreSQL when DATABASE_URL says so) and the
ordered migrations that keep data across upgrades."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Index, create_engine, event, inspect, text
from sqlalchemy.schema import CreateIndex

from gateway.accounting import tables
from gateway.accounting.tables import budgets, metadata, reservations, responses, schema_version, tasks, usage_events

WRITER_LOCK_WAIT_S = 5.0
READER_LOCK_WAIT_S = 30.0


def normalise_url(url: str) -> str:
    """Accept plain `sqlite:///path` and `postgresql://...` and pick the driver."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str, *, writer: bool = False) -> Engine:
    """`writer=True` gives the ledger writer's engine: on SQLite its transactions take
    the write lock up front (BEGIN IMMEDIATE), so concurrent writers queue instead of
    failing on a lock upgrade, and savepoints work."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # How long to wait for another process's write lock before giving up. The writer
        # holds up every hold while it waits, so it gives up soon, with a clear error
        # (requests get a 503, settlements go to the spool); readers wait longer.
        lock_wait_s = WRITER_LOCK_WAIT_S if writer else READER_LOCK_WAIT_S
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": lock_wait_s})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _: Any) -> None:
            cursor = dbapi_conn.cursor()
            _wal_mode(cursor, lock_wait_s)
            # FULL: a committed reservation survives power loss, not just a crash.
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute(f"PRAGMA busy_timeout={int(lock_wait_s * 1000)}")
            cursor.close()
            # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin.
            dbapi_conn.isolation_level = None

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            conn.exec_driver_sql(begin_statement("sqlite", writer=writer))

        return engine
    tables.for_postgresql()  # the partial indexes' conditions, for whatever builds them on this engine
    return create_engine(url, pool_size=8, max_overflow=8, pool_pre_ping=True)


def _wal_mode(cursor: Any, wait_s: float) -> None:
    """Put the database in WAL mode, waiting up to `wait_s` for a lock another
    connection holds. SQLite does not wait for that lock itself: while another process
    writes to a database not yet in WAL mode (as the first of `--workers N` does while
    it creates the ledger), the switch fails at once with "database is locked",
    whatever the busy timeout."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)


def begin_statement(dialect_name: str, *, writer: bool) -> str:
    """How a ledger transaction starts. The writer's SQLite transactions take the write
    lock up front (see `make_engine`); the ledger writer sends this itself on its own
    connection, which SQLAlchemy's "begin" event never sees."""
    return "BEGIN IMMEDIATE" if writer and dialect_name == "sqlite" else "BEGIN"


def _v1_initial(conn: Connection) -> None:
    metadata.create_all(conn, tables=[budgets, reservations, usage_events, tasks])


def _v2_route_verdicts(conn: Connection) -> None:
    have = {c["name"] for c in inspect(conn).get_columns("usage_events")}
    for name in ("checks", "escalation"):
        if name not in have:
            conn.exec_driver_sql(f"ALTER TABLE usage_events ADD COLUMN {name} VARCHAR(300)")


# Indexes no query used, written on every hold and settlement (see tables.py).
_V3_DROPPED = ("ix_reservations_request_id", "ix_reservations_tenant", "ix_reservations_task_id", "ix_reservations_state",
               "ix_reservations_expires_at", "ix_usage_events_reservation_id", "ix_usage_events_task_id",
               "ix_usage_events_provider_request_id")


def _v3_lean_indexes(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        return  # built and dropped without blocking the ledger's writes: see `maintain_indexes`
    for name in _V3_DROPPED:
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
    for index in _declared_indexes():
        index.create(conn, checkfirst=True)


def _v4_estimated_usage(conn: Connection) -> None:
    if "estimated" not in {c["name"] for c in inspect(conn).get_columns("usage_events")}:
        conn.exec_driver_sql("ALTER TABLE usage_events ADD COLUMN estimated BOOLEAN NOT NULL DEFAULT FALSE")
    if "max_output_tokens" not in {c["name"] for c in inspect(conn).get_columns("reservations")}:
        conn.exec_driver_sql("ALTER TABLE reservations ADD COLUMN max_output_tokens INTEGER NOT NULL DEFAULT 0")


def _v5_stored_responses(conn: Connection) -> None:
    metadata.create_all(conn, tables=[responses])  # with its index; checks first, as every step must


def _v6_hour_cache_writes(conn: Connection) -> None:
    if "cache_write_1h_tokens" not in {c["name"] for c in inspect(conn).get_columns("usage_events")}:
        conn.exec_driver_sql("ALTER TABLE usage_events ADD COLUMN cache_write_1h_tokens INTEGER NOT NULL DEFAULT 0")


def _declared_indexes() -> list[Index]:
    return [*reservations.indexes, *usage_events.indexes]


# Append only; never edit a shipped migration. Each must be safe on a database that
# already has what it adds (fresh databases get the current tables in v1).
MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [
    (1, _v1_initial),
    (2, _v2_route_verdicts),
    (3, _v3_lean_indexes),
    (4, _v4_estimated_usage),
    (5, _v5_stored_responses),
    (6, _v6_hour_cache_writes),
]


def migrate(engine: Engine) -> int:
    """Bring the schema up to date; returns the version now in place."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # One migrator at a time when several replicas start together.
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7245001)")
        metadata.create_all(conn, tables=[schema_version])
        done = {row[0] for row in conn.execute(text("SELECT version FROM schema_version"))}
        for version, step in MIGRATIONS:
            if version in done:
                continue
            step(conn)
            conn.execute(schema_version.insert().values(version=version, applied_at=datetime.now(UTC)))
        return max([v for v, _ in MIGRATIONS])


PRESENT_INDEXES = (
    "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema()"
)
INDEX_UPKEEP_LOCK = 7245002


def maintain_indexes(engine: Engine) -> list[str]:
    """PostgreSQL: bring the ledger's indexes to what tables.py declares, CONCURRENTLY.
    A plain CREATE or DROP INDEX locks its table against writes while it runs, and on
    `usage_events` that is every settlement of every replica until the table is scanned.
    Runs outside any transaction (as CONCURRENTLY must), after `migrate`, by one replica
    at a time; one that finds another at it returns at once. An index a crashed build
    left invalid is dropped and built again. Returns what it did, for the log; does
    nothing on SQLite, whose one process builds them in `migrate`."""
    if engine.dialect.name != "postgresql":
        return []
    done: list[str] = []
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not conn.exec_driver_sql(f"SELECT pg_try_advisory_lock({INDEX_UPKEEP_LOCK})").scalar():
            return done
        try:
            present: dict[str, bool] = {name: valid for name, valid in conn.exec_driver_sql(PRESENT_INDEXES)}
            for index in _declared_indexes():
                name = str(index.name)
                if present.get(name) is True:
                    continue
                if name in present:
                    conn.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
                conn.exec_driver_sql(_concurrently(str(CreateIndex(index).compile(dialect=engine.dialect))))
                done.append(f"built {name}")
            for name in _V3_DROPPED:
                if name in present:
                    conn.exec_driver_sql(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
                    done.append(f"dropped {name}")
        finally:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({INDEX_UPKEEP_LOCK})")
    return done


def _concurrently(create_index: str) -> str:
    return re.sub(r"^CREATE (UNIQUE )?INDEX ", r"CREATE \1INDEX CONCURRENTLY ", create_index)


def table_names(engine: Engine) -> list[str]:
    return sorted(inspect(engine).get_table_names())
