"""Tasks: a shared budget, call and token limits, and a deadline for every call an
agent makes on one piece of work; plus the task's own books."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import anyio
import orjson
from sqlalchemy import Engine, text

from gateway.accounting.driver_sql import DriverSql, insert_sql
from gateway.accounting.money import pico_from_usd, usd
from gateway.accounting.writer import GroupCommitWriter, LedgerUnavailable
from gateway.errors import NotReady
from gateway.routing.policy import TaskLimits

CACHE_SIZE = 10_000
INSERT_BUDGET = insert_sql("budgets", ["id", "scope", "period_start", "reserved_pico", "spent_pico", "limit_pico", "calls_limit",
                                       "calls_used", "tokens_limit", "tokens_reserved", "tokens_used"])
INSERT_TASK = insert_sql("tasks", ["id", "tenant", "key_id", "budget_id", "deadline_at", "created_at"])


@dataclass(frozen=True, slots=True)
class TaskInfo:
    id: str
    tenant: str
    budget_id: str
    deadline_at: datetime | None


class TaskStore:
    def __init__(self, writer: GroupCommitWriter, reader: Engine) -> None:
        self.writer = writer
        self.reader = reader
        self._cache: OrderedDict[str, TaskInfo] = OrderedDict()  # tasks never change owner or deadline

    async def create(self, tenant: str, key_id: str, limits: TaskLimits) -> TaskInfo:
        task_id = "task_" + secrets.token_hex(10)
        now = datetime.now(UTC)
        deadline = now + timedelta(seconds=limits.deadline_s) if limits.deadline_s else None
        info = TaskInfo(task_id, tenant, f"task:{task_id}", deadline)

        def op(sql: DriverSql) -> None:
            sql.execute(INSERT_BUDGET, dict(
                id=info.budget_id, scope=f"task:{task_id}", period_start="", reserved_pico=0, spent_pico=0,
                limit_pico=pico_from_usd(limits.budget_usd) if limits.budget_usd is not None else None,
                calls_limit=limits.max_calls, calls_used=0, tokens_limit=limits.max_tokens, tokens_reserved=0, tokens_used=0))
            sql.execute(INSERT_TASK, dict(
                id=task_id, tenant=tenant, key_id=key_id, budget_id=info.budget_id, deadline_at=deadline, created_at=now))

        try:
            await self.writer.run(op, isolated=True)
        except LedgerUnavailable as exc:
            raise NotReady(f"the ledger database is unreachable, so the task cannot be opened: {type(exc.__cause__ or exc).__name__}") from exc
        self._remember(info)
        return info

    async def get(self, task_id: str) -> TaskInfo | None:
        cached = self._cache.get(task_id)
        if cached is not None:
            return cached
        row = await anyio.to_thread.run_sync(self._fetch_task, task_id)
        if row is None:
            return None
        info = TaskInfo(row.id, row.tenant, row.budget_id, _aware(row.deadline_at))
        self._remember(info)
        return info

    def _remember(self, info: TaskInfo) -> None:
        self._cache[info.id] = info
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    def _fetch_task(self, task_id: str) -> Any:
        with self.reader.connect() as conn:
            return conn.execute(text("SELECT id, tenant, budget_id, deadline_at FROM tasks WHERE id = :id"), {"id": task_id}).first()

    async def spent_pico(self, task: TaskInfo) -> int:
        def read() -> int:
            with self.reader.connect() as conn:
                return int(conn.execute(text("SELECT spent_pico FROM budgets WHERE id = :id"), {"id": task.budget_id}).scalar_one())

        return await anyio.to_thread.run_sync(read)

    async def books(self, task: TaskInfo) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(self._books, task)

    def _books(self, task: TaskInfo) -> dict[str, Any]:
        with self.reader.connect() as conn:
            budget = conn.execute(text("SELECT * FROM budgets WHERE id = :id"), {"id": task.budget_id}).one()
            events = conn.execute(text(
                "SELECT request_id, attempt, kind, model, upstream, status, http_status, prompt_tokens, cached_tokens,"
                " completion_tokens, cost_pico, usage_known, created_at, timeline, error FROM usage_events"
                " WHERE task_id = :id ORDER BY created_at, request_id, attempt"), {"id": task.id}).all()
        calls = [_call(e) for e in events]
        now = datetime.now(UTC)
        limit = budget.limit_pico
        return {
            "id": task.id,
            "object": "task",
            "budget": {
                "limit_usd": usd(limit) if limit is not None else None,
                "reserved_usd": usd(budget.reserved_pico),
                "settled_usd": usd(budget.spent_pico),
                "remaining_usd": usd(max(0, limit - budget.reserved_pico - budget.spent_pico)) if limit is not None else None,
            },
            "calls": {"limit": budget.calls_limit, "used": budget.calls_used},
            "tokens": {"limit": budget.tokens_limit, "used": budget.tokens_used, "reserved": budget.tokens_reserved},
            "deadline_at": task.deadline_at.isoformat() if task.deadline_at else None,
            "seconds_left": round((task.deadline_at - now).total_seconds(), 3) if task.deadline_at else None,
            "events": calls,
            "critical_path": critical_path(calls),
        }


def _call(e: Any) -> dict[str, Any]:
    created = _aware(e.created_at)
    return {
        "request_id": e.request_id, "attempt": e.attempt, "kind": e.kind, "model": e.model, "upstream": e.upstream,
        "status": e.status, "http_status": e.http_status, "prompt_tokens": e.prompt_tokens, "cached_tokens": e.cached_tokens,
        "completion_tokens": e.completion_tokens, "cost_usd": usd(e.cost_pico), "usage_confirmed": bool(e.usage_known),
        "started_at": created.isoformat() if created else None, "timeline_ms": orjson.loads(e.timeline), "error": e.error,
    }


def critical_path(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The chain of calls that set the task's wall-clock time: walking back from the
    call that ended last, each step is the latest call that ended before it began."""
    spans = []
    for c in calls:
        if not c["started_at"]:
            continue
        start = datetime.fromisoformat(c["started_at"]).timestamp()
        offsets = c["timeline_ms"]
        first = offsets.get("upstream_start") or 0.0
        end = offsets.get("end") or first
        spans.append((start, start + (end - first) / 1000.0, c["request_id"], c["attempt"]))
    if not spans:
        return {"calls": [], "seconds": 0.0}
    spans.sort(key=lambda s: s[1])
    path = [spans[-1]]
    while True:
        begin = path[-1][0]
        before = [s for s in spans if s[1] <= begin]
        if not before:
            break
        path.append(before[-1])
    path.reverse()
    return {"calls": [f"{s[2]}#{s[3]}" for s in path], "seconds": round(path[-1][1] - path[0][0], 3)}


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def task_limits(requested: dict[str, Any], tenant_defaults: TaskLimits | None, defaults: TaskLimits) -> TaskLimits:
    """Request fields win, then the tenant's task_limits, then the policy default."""
    merged: dict[str, Any] = {}
    for source in (defaults, tenant_defaults):
        if source is not None:
            merged.update({k: v for k, v in source.model_dump().items() if v is not None})
    merged.update({k: v for k, v in requested.items() if v is not None})
    if "budget_usd" in merged:
        merged["budget_usd"] = Decimal(str(merged["budget_usd"]))
    return TaskLimits.model_validate(merged)
