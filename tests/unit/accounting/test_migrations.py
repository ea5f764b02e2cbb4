"""Upgrading a ledger keeps its data: a database at an older schema version is
migrated in place, and migrating twice changes nothing."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text

from gateway.accounting.database import MIGRATIONS, maintain_indexes, make_engine, migrate
from gateway.accounting.ledger import ORPHANS


def test_v1_ledger_upgrades_in_place_and_keeps_its_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url, writer=True)
    migrate(engine)
    # Make it look like a ledger written by schema v1: no v2 columns, one booked row.
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE usage_events DROP COLUMN checks")
        conn.exec_driver_sql("ALTER TABLE usage_events DROP COLUMN escalation")
        conn.exec_driver_sql("ALTER TABLE usage_events DROP COLUMN estimated")
        conn.exec_driver_sql("ALTER TABLE usage_events DROP COLUMN cache_write_1h_tokens")
        conn.exec_driver_sql("ALTER TABLE reservations DROP COLUMN max_output_tokens")
        conn.exec_driver_sql("DELETE FROM schema_version WHERE version > 1")
        conn.execute(text(
            "INSERT INTO usage_events (request_id, attempt, tenant, key_id, kind, endpoint, model, upstream_model, upstream, status,"
            " usage_known, prompt_tokens_est, prompt_tokens, cached_tokens, cache_write_tokens, completion_tokens, reasoning_tokens,"
            " cost_pico, saved_pico, created_at, day, timeline) VALUES ('req_old', 1, 'acme', 'key_1', 'model', 'chat.completions',"
            " 'm', 'm', 'u', 'ok', 1, 10, 10, 0, 0, 5, 0, 123456, 0, '2026-01-01 00:00:00', '2026-01-01', '{}')"))
    assert migrate(engine) == max(v for v, _ in MIGRATIONS)
    assert migrate(engine) == max(v for v, _ in MIGRATIONS)  # idempotent
    columns = {c["name"] for c in inspect(engine).get_columns("usage_events")}
    assert {"checks", "escalation", "estimated", "cache_write_1h_tokens"} <= columns
    assert "max_output_tokens" in {c["name"] for c in inspect(engine).get_columns("reservations")}
    with engine.connect() as conn:
        old = conn.execute(text("SELECT cost_pico, estimated, cache_write_1h_tokens FROM usage_events WHERE request_id = 'req_old'"))
        assert old.one() == (123456, 0, 0)
        versions = [r[0] for r in conn.execute(text("SELECT version FROM schema_version ORDER BY version"))]
    assert versions == [v for v, _ in MIGRATIONS]
    engine.dispose()


LEAN = {"reservations": {"ix_reservations_open"},
        "usage_events": {"ix_usage_day_tenant_model", "ix_usage_events_request_id", "ix_usage_events_task"}}


def _indexes(engine: Engine) -> dict[str, set[str]]:
    found = inspect(engine)
    return {table: {i["name"] for i in found.get_indexes(table) if i["name"]} for table in LEAN}


def test_v2_ledger_loses_the_indexes_every_hold_paid_for_and_the_sweeper_keeps_its_own(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}", writer=True)
    migrate(engine)
    assert _indexes(engine) == LEAN  # a new ledger starts lean
    with engine.begin() as conn:  # as schema v2 left it: an index per looked-up column, none partial
        for name in ("ix_reservations_open", "ix_usage_events_task"):
            conn.exec_driver_sql(f"DROP INDEX {name}")
        for table, column in [("reservations", "request_id"), ("reservations", "tenant"), ("reservations", "task_id"),
                              ("reservations", "state"), ("reservations", "expires_at"), ("usage_events", "task_id"),
                              ("usage_events", "reservation_id"), ("usage_events", "provider_request_id")]:
            conn.exec_driver_sql(f"CREATE INDEX ix_{table}_{column} ON {table} ({column})")
        conn.exec_driver_sql("DELETE FROM schema_version WHERE version > 2")
    assert migrate(engine) == migrate(engine) == max(v for v, _ in MIGRATIONS)
    assert _indexes(engine) == LEAN
    with engine.connect() as conn:
        sweep = " ".join(str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {ORPHANS}", {"now": "2026-01-01"}))
        calls = " ".join(str(r[-1]) for r in conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN SELECT request_id FROM usage_events WHERE task_id = :id", {"id": "task_1"}))
    assert "ix_reservations_open" in sweep  # the sweeper reads open holds only, not every hold ever made
    assert "ix_usage_events_task" in calls
    engine.dispose()


def _v2_shape(engine: Engine) -> None:
    """Make a current ledger look as schema v2 left it: an index per looked-up column, none partial."""
    with engine.begin() as conn:
        for name in ("ix_reservations_open", "ix_usage_events_task"):
            conn.exec_driver_sql(f"DROP INDEX {name}")
        for table, column in [("reservations", "request_id"), ("reservations", "tenant"), ("usage_events", "task_id"),
                              ("usage_events", "provider_request_id")]:
            conn.exec_driver_sql(f"CREATE INDEX ix_{table}_{column} ON {table} ({column})")
        conn.exec_driver_sql("DELETE FROM schema_version WHERE version > 2")


def _insert_event(conn: Any, request_id: str) -> None:
    conn.execute(
        "INSERT INTO usage_events (request_id, attempt, tenant, key_id, kind, endpoint, model, upstream_model, upstream, status,"
        " usage_known, prompt_tokens_est, prompt_tokens, cached_tokens, cache_write_tokens, completion_tokens, reasoning_tokens,"
        " cost_pico, saved_pico, created_at, day, timeline) VALUES (%s, 1, 'acme', 'key_1', 'model', 'chat.completions',"
        " 'm', 'm', 'u', 'ok', true, 10, 10, 0, 0, 5, 0, 1, 0, now(), '2026-01-01', '{}')", (request_id,))


def _wait_for_a_blocked_backend(admin: Any, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        waiting = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()").fetchone()[0]
        if waiting:
            return
        time.sleep(0.01)
    raise AssertionError("the upgrade never waited on the open transaction")


def test_postgresql_upgrade_builds_its_indexes_without_stopping_ledger_writes(postgres_url: str) -> None:
    import psycopg

    engine = make_engine(postgres_url, writer=True)
    migrate(engine)
    _v2_shape(engine)
    with psycopg.connect(postgres_url) as open_tx, psycopg.connect(postgres_url, autocommit=True) as admin, \
            psycopg.connect(postgres_url) as writer:
        _insert_event(open_tx, "req_in_flight")  # a replica's ledger transaction, not committed yet
        upgrade = ThreadPoolExecutor(1).submit(lambda: (migrate(engine), maintain_indexes(engine)))
        _wait_for_a_blocked_backend(admin)  # the upgrade waits for that transaction to end ...
        writer.execute("SET lock_timeout = '5s'")
        _insert_event(writer, "req_meanwhile")  # ... and meanwhile other settlements still go in
        writer.commit()
        open_tx.commit()
        version, done = upgrade.result(timeout=60)
    assert version == max(v for v, _ in MIGRATIONS)
    assert "built ix_usage_events_task" in done and "dropped ix_usage_events_task_id" in done
    assert _indexes(engine) == LEAN
    with engine.connect() as conn:
        invalid = conn.exec_driver_sql("SELECT count(*) FROM pg_index WHERE NOT indisvalid").scalar_one()
        booked = conn.exec_driver_sql("SELECT count(*) FROM usage_events").scalar_one()
    assert (invalid, booked) == (0, 2)
    engine.dispose()


def test_postgresql_index_left_invalid_by_a_failed_build_is_built_again(postgres_url: str) -> None:
    import psycopg

    engine = make_engine(postgres_url, writer=True)
    migrate(engine)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("DROP INDEX ix_usage_events_task")
        for request_id in ("req_a", "req_b"):
            _insert_event(conn, request_id)
        # A build that fails half-way (here: not unique) leaves an invalid index under the name.
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY ix_usage_events_task ON usage_events (tenant)")
    assert maintain_indexes(engine) == ["built ix_usage_events_task"]
    assert maintain_indexes(engine) == []  # nothing left to do
    with engine.connect() as conn:
        row = conn.exec_driver_sql("SELECT i.indisvalid, i.indisunique, pg_get_indexdef(i.indexrelid) FROM pg_index i"
                                   " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'ix_usage_events_task'").one()
    assert row[0] and not row[1] and "(task_id) WHERE (task_id IS NOT NULL)" in row[2]
    engine.dispose()


def test_a_new_postgresql_ledger_gets_partial_indexes_as_sqlite_does(postgres_url: str) -> None:
    engine = make_engine(postgres_url, writer=True)
    migrate(engine)
    with engine.connect() as conn:
        defs = dict(conn.exec_driver_sql("SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN"
                                         " ('ix_reservations_open', 'ix_usage_events_task')").all())
    assert "(expires_at) WHERE ((state)::text = 'reserved'::text)" in defs["ix_reservations_open"]
    assert "(task_id) WHERE (task_id IS NOT NULL)" in defs["ix_usage_events_task"]
    engine.dispose()
