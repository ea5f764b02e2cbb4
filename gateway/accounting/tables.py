"""Ledger tables. Money is integer pico-dollars (1e-12 USD): a per-1M-token price with
up to six decimals times a token count is then an exact integer, with no float anywhere.
BIGINT holds 9.2 million USD per row or per budget counter.

Every index on `reservations` and `usage_events` is written inside the commit a request
waits for before its upstream call (a hold's and a settlement's pages go to the WAL
and are fsynced together), so these tables carry only the indexes a query uses.

Declared as SQLAlchemy Core tables: the ledger reads and writes them with SQL of its own
(driver_sql.py, ledger.py, reconcile.py), never as objects. Declared as model classes they
cost `gateway serve` ~0.3 s of start-up, a quarter of it, for nothing it used."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, Column, DateTime, Dialect, Index, Integer, MetaData, String, Table, Text, false, text
from sqlalchemy.types import TypeDecorator


class UtcDateTime(TypeDecorator[datetime]):
    """A point in time: stored with its zone where the database keeps one (PostgreSQL),
    as UTC without one where it does not (SQLite); always read back aware, in UTC."""

    impl = DateTime
    cache_ok = True

    def __init__(self) -> None:
        super().__init__(timezone=True)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.utcoffset() is None:
            raise ValueError(f"a ledger time must carry its zone (datetime.now(UTC)), not {value!r}")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.utcoffset() is None else value.astimezone(UTC)


def _column(name: str, kind: Any, nullable: bool, **kw: Any) -> Column[Any]:
    return Column(name, kind, nullable=nullable, **kw)


def short(name: str, length: int, *, nullable: bool = False, **kw: Any) -> Column[Any]:
    """Short text: an id, a name, a state."""
    return _column(name, String(length), nullable, **kw)


def count(name: str, *, nullable: bool = False, **kw: Any) -> Column[Any]:
    return _column(name, Integer, nullable, **kw)


def pico(name: str, *, nullable: bool = False, **kw: Any) -> Column[Any]:
    """Money in pico-dollars, or a token count that may pass 2**31."""
    return _column(name, BigInteger, nullable, **kw)


def when(name: str, *, nullable: bool = False) -> Column[Any]:
    return _column(name, UtcDateTime(), nullable)


def long_text(name: str, *, nullable: bool = False, **kw: Any) -> Column[Any]:
    return _column(name, Text, nullable, **kw)


def flag(name: str, *, default: bool, **kw: Any) -> Column[Any]:
    return _column(name, Boolean, False, default=default, **kw)


metadata = MetaData()

# One spend counter: a tenant's period (`tenant:acme:month:2026-11`) or a task.
budgets = Table(
    "budgets", metadata,
    short("id", 200, primary_key=True),
    short("scope", 200, index=True),
    short("period_start", 20, default=""),
    pico("limit_pico", nullable=True),
    pico("reserved_pico", default=0),
    pico("spent_pico", default=0),
    count("calls_limit", nullable=True),
    count("calls_used", default=0),
    pico("tokens_limit", nullable=True),
    pico("tokens_reserved", default=0),
    pico("tokens_used", default=0),
)

OPEN = text("state = 'reserved'")
WITH_TASK = text("task_id IS NOT NULL")
# Partial indexes, by name: SQLite's condition is given in the table below, PostgreSQL's
# by `for_postgresql` when a PostgreSQL schema is created (a `postgresql_where=` here
# imports that dialect at every start, SQLite or not: ~60 ms of start-up).
PARTIAL_INDEXES = {"ix_reservations_open": OPEN, "ix_usage_events_task": WITH_TASK}

# Worst-case cost held against budgets before the upstream call; ends exactly once as
# settled, released or expired.
reservations = Table(
    "reservations", metadata,
    short("id", 40, primary_key=True),
    short("request_id", 40),
    short("tenant", 128),
    short("key_id", 40),
    short("task_id", 40, nullable=True),
    short("model", 128),
    short("upstream_model", 200, default=""),
    short("upstream", 128),
    short("endpoint", 40),
    long_text("budget_ids"),  # newline-separated
    pico("amount_pico"),
    pico("tokens"),
    count("prompt_tokens_est", default=0),
    # Added in schema v4: the call's output bound, for the estimate a crash leaves behind.
    count("max_output_tokens", default=0, server_default="0"),
    pico("settled_pico", nullable=True),
    short("state", 16, default="reserved"),
    when("created_at"),
    when("expires_at"),
    when("ended_at", nullable=True),
    # The sweeper's question - which open holds are past expiry - and nothing else.
    Index("ix_reservations_open", "expires_at", sqlite_where=OPEN),
)

# One row per upstream attempt (and per cache hit or tool call), whatever its outcome.
usage_events = Table(
    "usage_events", metadata,
    count("id", primary_key=True),
    short("request_id", 40, index=True),
    count("attempt", default=1),
    short("reservation_id", 40, nullable=True),
    short("tenant", 128),
    short("key_id", 40),
    short("task_id", 40, nullable=True),
    short("kind", 16, default="model"),  # model | cache_hit | tool
    short("endpoint", 40),
    short("model", 128),
    short("upstream_model", 200, default=""),  # the name the provider bills under
    short("upstream", 128),
    short("replica", 300, nullable=True),
    short("provider_request_id", 200, nullable=True),
    short("route", 128, nullable=True),
    short("status", 16),  # ok | error | timeout | cancelled | cut | unconfirmed
    count("http_status", nullable=True),
    long_text("error", nullable=True),
    flag("usage_known", default=False),
    count("prompt_tokens_est", default=0),
    count("prompt_tokens", default=0),
    count("cached_tokens", default=0),
    count("cache_write_tokens", default=0),
    count("completion_tokens", default=0),
    count("reasoning_tokens", default=0),
    pico("cost_pico", default=0),
    pico("saved_pico", default=0),
    short("price_source", 200, nullable=True),
    when("created_at"),
    short("day", 10),
    long_text("timeline", default="{}"),  # JSON, ms offsets
    # Added in schema v2: the verifiable checks' verdict on this attempt's answer
    # ("passed", or "failed: invalid_json, truncated"), and for an attempt that a route
    # escalated away from, why.
    short("checks", 300, nullable=True),
    short("escalation", 300, nullable=True),
    # Added in schema v4: the provider never reported this attempt's usage; its tokens and
    # cost are the gateway's estimate (prompt plus relayed output), which reconciliation corrects.
    flag("estimated", default=False, server_default=false()),  # a server default: older replicas leave it out
    # Added in schema v6: of the cache writes, those kept an hour (Anthropic), which cost more.
    count("cache_write_1h_tokens", default=0, server_default=text("0")),
    Index("ix_usage_day_tenant_model", "day", "tenant", "model"),
    Index("ix_usage_events_task", "task_id", sqlite_where=WITH_TASK),  # a task's calls
)

tasks = Table(
    "tasks", metadata,
    short("id", 40, primary_key=True),
    short("tenant", 128, index=True),
    short("key_id", 40),
    short("budget_id", 200),
    when("deadline_at", nullable=True),
    when("created_at"),
)

# Stored Responses-API responses (schema v5): the conversation a `previous_response_id`
# continues, per tenant, until `expires_at` (the policy's `defaults.responses.ttl_s`).
responses = Table(
    "responses", metadata,
    short("id", 64, primary_key=True),
    short("tenant", 128),
    long_text("history"),  # JSON: every earlier turn's input and output items
    long_text("input_items"),  # JSON: this turn's input items
    long_text("response"),  # JSON: the Response object as the client got it
    pico("size_bytes"),
    when("created_at"),
    when("expires_at"),
    Index("ix_responses_expires_at", "expires_at"),  # the sweeper's purge
)

schema_version = Table(
    "schema_version", metadata,
    count("version", primary_key=True),
    when("applied_at"),
)


def for_postgresql() -> None:
    """Give the partial indexes their condition on PostgreSQL too (idempotent)."""
    for table in (reservations, usage_events):
        for index in table.indexes:
            if index.name in PARTIAL_INDEXES:
                index.dialect_options["postgresql"]["where"] = PARTIAL_INDEXES[index.name]
