"""Ledger tables. Money is integer pico-dollars (1e-12 USD): a per-1M-token price with
up to six decimals times a token count is then an exact integer, with no float anywhere.
BIGINT holds 9.2 million USD per row or per budget counter.

Every index on `reservations` and `usage_events` is written inside the commit a request
waits for before its upstream call (a hold's and a settlement's pages go to the WAL
and are fsynced together), so these tables carry only the indexes a query uses."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Column, Index, Text, text
from sqlmodel import Field, SQLModel


class Budget(SQLModel, table=True):
    """One spend counter: a tenant's period (`tenant:acme:month:2026-11`) or a task."""

    __tablename__ = "budgets"
    id: str = Field(primary_key=True, max_length=200)
    scope: str = Field(max_length=200, index=True)
    period_start: str = Field(default="", max_length=20)
    limit_pico: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    reserved_pico: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))
    spent_pico: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))
    calls_limit: int | None = None
    calls_used: int = 0
    tokens_limit: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    tokens_reserved: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))
    tokens_used: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))


OPEN = text("state = 'reserved'")
WITH_TASK = text("task_id IS NOT NULL")


class Reservation(SQLModel, table=True):
    """Worst-case cost held against budgets before the upstream call; ends exactly once
    as settled, released or expired."""

    __tablename__ = "reservations"
    # The sweeper's question - which open holds are past expiry - and nothing else.
    __table_args__ = (Index("ix_reservations_open", "expires_at", sqlite_where=OPEN, postgresql_where=OPEN),)
    id: str = Field(primary_key=True, max_length=40)
    request_id: str = Field(max_length=40)
    tenant: str = Field(max_length=128)
    key_id: str = Field(max_length=40)
    task_id: str | None = Field(default=None, max_length=40)
    model: str = Field(max_length=128)
    upstream_model: str = Field(default="", max_length=200)
    upstream: str = Field(max_length=128)
    endpoint: str = Field(max_length=40)
    budget_ids: str = Field(sa_column=Column(Text, nullable=False))  # newline-separated
    amount_pico: int = Field(sa_column=Column(BigInteger, nullable=False))
    tokens: int = Field(sa_column=Column(BigInteger, nullable=False))
    prompt_tokens_est: int = 0
    settled_pico: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    state: str = Field(default="reserved", max_length=16)
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None = None


class UsageEvent(SQLModel, table=True):
    """One row per upstream attempt (and per cache hit or tool call), whatever its outcome."""

    __tablename__ = "usage_events"
    __table_args__ = (
        Index("ix_usage_day_tenant_model", "day", "tenant", "model"),
        Index("ix_usage_events_task", "task_id", sqlite_where=WITH_TASK, postgresql_where=WITH_TASK),  # a task's calls
    )
    id: int | None = Field(default=None, primary_key=True)
    request_id: str = Field(max_length=40, index=True)
    attempt: int = 1
    reservation_id: str | None = Field(default=None, max_length=40)
    tenant: str = Field(max_length=128)
    key_id: str = Field(max_length=40)
    task_id: str | None = Field(default=None, max_length=40)
    kind: str = Field(default="model", max_length=16)  # model | cache_hit | tool
    endpoint: str = Field(max_length=40)
    model: str = Field(max_length=128)
    upstream_model: str = Field(default="", max_length=200)  # the name the provider bills under
    upstream: str = Field(max_length=128)
    replica: str | None = Field(default=None, max_length=300)
    provider_request_id: str | None = Field(default=None, max_length=200)
    route: str | None = Field(default=None, max_length=128)
    status: str = Field(max_length=16)  # ok | error | timeout | cancelled | cut | unconfirmed
    http_status: int | None = None
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    usage_known: bool = False
    prompt_tokens_est: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost_pico: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))
    saved_pico: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, default=0))
    price_source: str | None = Field(default=None, max_length=200)
    created_at: datetime
    day: str = Field(max_length=10)
    timeline: str = Field(default="{}", sa_column=Column(Text, nullable=False, default="{}"))  # JSON, ms offsets
    # Added in schema v2: the verifiable checks' verdict on this attempt's answer
    # ("passed", or "failed: invalid_json, truncated"), and for an attempt that a route
    # escalated away from, why.
    checks: str | None = Field(default=None, max_length=300)
    escalation: str | None = Field(default=None, max_length=300)


class Task(SQLModel, table=True):
    __tablename__ = "tasks"
    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(max_length=128, index=True)
    key_id: str = Field(max_length=40)
    budget_id: str = Field(max_length=200)
    deadline_at: datetime | None = None
    created_at: datetime


class SchemaVersion(SQLModel, table=True):
    __tablename__ = "schema_version"
    version: int = Field(primary_key=True)
    applied_at: datetime
