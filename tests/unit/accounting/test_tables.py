"""The ledger's tables as the databases see them: money in 64-bit integers, and times
that keep their zone, stored and read back as UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import StatementError
from sqlalchemy.schema import CreateTable

from gateway.accounting.tables import budgets, metadata, reservations, responses, schema_version, tasks, usage_events


def test_money_is_64_bit_and_times_keep_their_zone_on_postgresql() -> None:
    ddl = {table.name: str(CreateTable(table).compile(dialect=postgresql.dialect())) for table in metadata.sorted_tables}
    assert set(ddl) == {t.name for t in (budgets, reservations, usage_events, tasks, responses, schema_version)}
    for table, column in (("budgets", "spent_pico"), ("budgets", "limit_pico"), ("reservations", "amount_pico"),
                          ("usage_events", "cost_pico"), ("usage_events", "saved_pico")):
        assert f"\t{column} BIGINT" in ddl[table]
    for table, column in (("reservations", "expires_at"), ("usage_events", "created_at"), ("tasks", "deadline_at"),
                          ("responses", "expires_at")):
        assert f"\t{column} TIMESTAMP WITH TIME ZONE" in ddl[table]


def test_times_are_stored_as_utc_and_read_back_aware() -> None:
    engine = create_engine("sqlite://")
    metadata.create_all(engine, tables=[schema_version])
    in_paris = datetime(2026, 11, 29, 23, 30, tzinfo=timezone(timedelta(hours=1)))
    with engine.begin() as conn:
        conn.execute(schema_version.insert().values(version=1, applied_at=in_paris))
        stored = conn.exec_driver_sql("SELECT applied_at FROM schema_version").scalar_one()
        read = conn.execute(select(schema_version.c.applied_at)).scalar_one()
    assert stored.startswith("2026-11-29 22:30:00")  # SQLite keeps no zone: UTC text
    assert read == in_paris and read.tzinfo == UTC


def test_a_time_without_a_zone_is_refused() -> None:
    engine = create_engine("sqlite://")
    metadata.create_all(engine, tables=[schema_version])
    with engine.begin() as conn, pytest.raises(StatementError, match="must carry its zone"):
        conn.execute(schema_version.insert().values(version=1, applied_at=datetime(2026, 11, 29, 23, 30)))
