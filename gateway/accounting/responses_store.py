"""Stored Responses-API responses, in the ledger database (SQLite or PostgreSQL): what
`GET/DELETE /v1/responses/{id}`, `input_items` and `previous_response_id` read.

Every read and delete is scoped to the tenant: another tenant's id is simply not
there. Writes go through the ledger's group-commit writer (a response is stored
before the client sees it, so a retrieve right after finds it); reads use the
reader engine off the event loop. Rows past `expires_at` are invisible and purged by
the sweeper."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import orjson
from sqlalchemy import Engine, select

from gateway.accounting.driver_sql import DriverSql, insert_sql
from gateway.accounting.tables import responses
from gateway.accounting.writer import GroupCommitWriter, LedgerUnavailable
from gateway.errors import NotReady

INSERT = insert_sql("responses", ["id", "tenant", "history", "input_items", "response", "size_bytes", "created_at", "expires_at"])
DELETE = "DELETE FROM responses WHERE id = :id AND tenant = :tenant"
PURGE = "DELETE FROM responses WHERE expires_at < :now"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    tenant: str
    history: list[dict[str, Any]]  # earlier turns' items, oldest first
    input_items: list[dict[str, Any]]  # this turn's input
    response: dict[str, Any]

    def conversation(self) -> list[dict[str, Any]]:
        """Every item a turn continuing this one sends upstream before its own input."""
        return [*self.history, *self.input_items, *self.response.get("output", [])]


def encoded_size(history: list[dict[str, Any]], items: list[dict[str, Any]], response: dict[str, Any]) -> int:
    return sum(len(orjson.dumps(part)) for part in (history, items, response))


class ResponseStore:
    def __init__(self, writer: GroupCommitWriter, reader: Engine) -> None:
        self.writer = writer
        self.reader = reader

    async def save(self, tenant: str, stored: StoredResponse, ttl_s: float) -> None:
        now = datetime.now(UTC)
        parts = [orjson.dumps(stored.history), orjson.dumps(stored.input_items), orjson.dumps(stored.response)]
        row = dict(id=stored.id, tenant=tenant, history=parts[0].decode(), input_items=parts[1].decode(),
                   response=parts[2].decode(), size_bytes=sum(map(len, parts)), created_at=now,
                   expires_at=now + timedelta(seconds=ttl_s))

        def op(sql: DriverSql) -> None:
            sql.execute(INSERT, row)

        await self._write(op, "stored")

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        return await anyio.to_thread.run_sync(self._fetch, tenant, response_id)

    def _fetch(self, tenant: str, response_id: str) -> StoredResponse | None:
        query = select(responses.c.history, responses.c.input_items, responses.c.response).where(
            responses.c.id == response_id, responses.c.tenant == tenant, responses.c.expires_at > datetime.now(UTC))
        with self.reader.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return StoredResponse(response_id, tenant, orjson.loads(row.history), orjson.loads(row.input_items),
                              orjson.loads(row.response))

    async def delete(self, tenant: str, response_id: str) -> bool:
        def op(sql: DriverSql) -> int:
            return sql.execute(DELETE, {"id": response_id, "tenant": tenant})

        return bool(await self._write(op, "deleted"))

    async def purge_expired(self, now: datetime) -> int:
        def op(sql: DriverSql) -> int:
            return sql.execute(PURGE, {"now": now})

        return int(await self._write(op, "purged"))

    async def _write(self, op: Any, what: str) -> Any:
        try:
            return await self.writer.run(op)
        except LedgerUnavailable as exc:
            raise NotReady(f"the ledger database is unreachable, so the response cannot be {what}: "
                           f"{type(exc.__cause__ or exc).__name__}") from exc
