"""Spooled settlements are replayed into the ledger once it is back; a line that can
never be booked is set aside for an operator instead of holding back the rest."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from gateway.accounting.database import make_engine, migrate
from gateway.accounting.ledger import Ledger
from gateway.accounting.spool import SettlementSpool
from gateway.accounting.writer import GroupCommitWriter
from tests.unit.accounting.test_ledger import NOW, WIDE, request


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}", writer=True)
    migrate(engine)
    return engine


def event(n: int, hold_id: str) -> dict[str, object]:
    return dict(request_id=f"req_{n}", attempt=1, reservation_id=hold_id, tenant="acme", key_id="key_1", endpoint="chat",
                model="gpt-4o-mini", upstream="hosted", status="ok", usage_known=True, prompt_tokens=5,
                completion_tokens=2, cost_pico=30, created_at=NOW, day=NOW.date().isoformat())


def test_a_torn_line_is_set_aside_and_the_lines_after_it_are_booked(engine: Engine, tmp_path: Path) -> None:
    spool = SettlementSpool(tmp_path / "var")

    async def main() -> int:
        writer = GroupCommitWriter(engine)
        writer.start()
        ledger = Ledger(writer)
        try:
            first, second = [await ledger.reserve(request(n, 100), [WIDE]) for n in (1, 2)]
            spool.write([first], 30, 7, [event(1, first.id)], NOW)
            with spool.path.open("ab") as handle:
                handle.write(b'{"holds": [["rsv_3_0", 100, 10, ["x"]]], "charged_pi\n')  # a crash mid-write
            spool.write([second], 30, 7, [event(2, second.id)], NOW)
            return await spool.replay(ledger)
        finally:
            await writer.stop()

    assert asyncio.run(main()) == 2
    with engine.connect() as conn:
        booked = sorted(r[0] for r in conn.execute(text("SELECT request_id FROM usage_events")))
        holds = dict(conn.execute(text("SELECT request_id, state FROM reservations")).all())
    assert booked == ["req_1", "req_2"]
    assert holds == {"req_1": "settled", "req_2": "settled"}
    assert spool.pending() == []
    rejected = list((tmp_path / "var").glob("ledger-rejected-*.jsonl"))
    assert len(rejected) == 1 and b"charged_pi" in rejected[0].read_bytes()


def test_a_spool_claimed_by_a_process_that_died_mid_replay_is_replayed(engine: Engine, tmp_path: Path) -> None:
    spool = SettlementSpool(tmp_path / "var")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)

    async def main() -> int:
        writer = GroupCommitWriter(engine)
        writer.start()
        ledger = Ledger(writer)
        try:
            hold = await ledger.reserve(request(1, 100), [WIDE])
            spool.write([hold], 30, 7, [event(1, hold.id)], NOW)
            spool.path.rename(spool.path.with_suffix(f".replaying-{dead_pid}"))  # claimed, then the claimer crashed
            return await spool.replay(ledger)
        finally:
            await writer.stop()

    assert asyncio.run(main()) == 1
    with engine.connect() as conn:
        assert [r[0] for r in conn.execute(text("SELECT request_id FROM usage_events"))] == ["req_1"]
    assert not list((tmp_path / "var").iterdir())  # nothing left to replay, nothing set aside
