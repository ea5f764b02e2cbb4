"""The response store: tenant-scoped, expiring, purged."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gateway.accounting.database import make_engine, migrate
from gateway.accounting.responses_store import ResponseStore, StoredResponse
from gateway.accounting.writer import GroupCommitWriter


def test_scoped_expiring_and_purged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url, writer=True)
    migrate(engine)

    async def run() -> None:
        writer = GroupCommitWriter(engine)
        writer.start()
        store = ResponseStore(writer, make_engine(url))
        try:
            await store.save("acme", StoredResponse("resp_a", "acme", [], [{"type": "message"}], {"output": []}), ttl_s=3600)
            await store.save("acme", StoredResponse("resp_old", "acme", [], [], {"output": []}), ttl_s=-1)
            assert (await store.get("acme", "resp_a")) is not None
            assert await store.get("globex", "resp_a") is None
            assert not await store.delete("globex", "resp_a")
            assert await store.get("acme", "resp_old") is None  # past its age: gone for every verb
            assert await store.purge_expired(datetime.now(UTC)) == 1
            assert await store.purge_expired(datetime.now(UTC) + timedelta(hours=2)) == 1
        finally:
            await writer.stop()

    asyncio.run(run())
