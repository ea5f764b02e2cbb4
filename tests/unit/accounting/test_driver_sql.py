"""The writer's statements on SQLite: `:name` parameters bound by position, with the same
values and the same stored datetimes as binding them by name."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from gateway.accounting.driver_sql import DriverSql


@pytest.fixture
def sql() -> Iterator[DriverSql]:
    conn: Any = sqlite3.connect(":memory:", isolation_level=None)  # a DBAPI connection, as the writer's
    conn.execute("CREATE TABLE holds (id TEXT, amount INTEGER, limit_pico INTEGER, at TEXT)")
    yield DriverSql(conn.cursor(), pyformat=False, sqlite=True, returning=True, connection=conn)
    conn.close()


def test_a_parameter_named_twice_binds_the_same_value_in_both_places(sql: DriverSql) -> None:
    sql.execute("INSERT INTO holds (id, amount, limit_pico) VALUES (:id, :amount, :limit)", {"id": "a", "amount": 5, "limit": 9})
    changed = sql.execute("UPDATE holds SET amount = amount + :amount WHERE id = :id AND amount + :amount <= :limit",
                          {"id": "a", "amount": 4, "limit": 9, "unused": "ignored"})
    assert changed == 1
    assert sql.fetchone("SELECT amount FROM holds WHERE id = :id", {"id": "a"}) == (9,)
    refused = sql.execute("UPDATE holds SET amount = amount + :amount WHERE id = :id AND amount + :amount <= :limit",
                          {"id": "a", "amount": 1, "limit": 9})
    assert refused == 0


def test_datetimes_are_stored_as_naive_utc_text_in_every_statement_form(sql: DriverSql) -> None:
    at = datetime(2026, 11, 29, 23, 30, 0, 120000, tzinfo=timezone(timedelta(hours=2)))
    sql.execute("INSERT INTO holds (id, at) VALUES (:id, :at)", {"id": "one", "at": at})
    sql.executemany("INSERT INTO holds (id, at) VALUES (:id, :at)", [{"id": "many", "at": at.astimezone(UTC)}])
    rows = sql.fetchall("SELECT id, at FROM holds WHERE at = :at ORDER BY id", {"at": at})
    assert rows == [("many", "2026-11-29 21:30:00.120000"), ("one", "2026-11-29 21:30:00.120000")]


def test_a_missing_parameter_is_named_in_the_error(sql: DriverSql) -> None:
    with pytest.raises(KeyError, match=":amount"):
        sql.execute("INSERT INTO holds (id, amount) VALUES (:id, :amount)", {"id": "a"})


def test_statements_with_one_parameter_or_none_bind_too(sql: DriverSql) -> None:
    at = datetime(2026, 12, 1, 9, 0, 0, 5, tzinfo=UTC)
    sql.execute("INSERT INTO holds (id, at) VALUES ('fixed', :at)", {"at": at})
    sql.execute("INSERT INTO holds (id, amount) VALUES (:id, 7)", {"id": "single"})
    assert sql.fetchall("SELECT id, amount, at FROM holds ORDER BY id", {}) == [
        ("fixed", None, "2026-12-01 09:00:00.000005"), ("single", 7, None)]
    with pytest.raises(KeyError, match=":id"):
        sql.execute("DELETE FROM holds WHERE id = :id", {})
