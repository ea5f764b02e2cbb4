"""Spooled settlements are replayed into the ledger once it is back; a line that can
never be booked is set aside for an operator instead of holding back the rest. Replicas
may share the folder (a shared volume, each replica pid 1 in its own container)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from gateway.accounting.database import make_engine, migrate
from gateway.accounting.ledger import Ledger
from gateway.accounting.spool import SettlementSpool
from tests.unit.accounting.test_ledger import NOW, WIDE, request, with_ledger


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}", writer=True)
    migrate(engine)
    return engine


def event(n: int, hold_id: str) -> dict[str, object]:
    return dict(request_id=f"req_{n}", attempt=1, reservation_id=hold_id, tenant="acme", key_id="key_1", endpoint="chat",
                model="gpt-4o-mini", upstream="hosted", status="ok", usage_known=True, prompt_tokens=5,
                completion_tokens=2, cost_pico=30, created_at=NOW, day=NOW.date().isoformat())


async def spooled(ledger: Ledger, spool: SettlementSpool, n: int) -> None:
    """Request `n` held, answered, and its settlement spooled while the ledger was down."""
    hold = await ledger.reserve(request(n, 100), [WIDE])
    spool.write([hold], 30, 7, [event(n, hold.id)], NOW)


def test_a_torn_line_is_set_aside_and_the_lines_after_it_are_booked(engine: Engine, tmp_path: Path) -> None:
    spool = SettlementSpool(tmp_path / "var")

    async def main(ledger: Ledger) -> int:
        first, second = [await ledger.reserve(request(n, 100), [WIDE]) for n in (1, 2)]
        spool.write([first], 30, 7, [event(1, first.id)], NOW)
        with spool.path.open("ab") as handle:
            handle.write(b'{"holds": [["rsv_3_0", 100, 10, ["x"]]], "charged_pi\n')  # a crash mid-write
        spool.write([second], 30, 7, [event(2, second.id)], NOW)
        return await spool.replay(ledger)

    assert with_ledger(engine, main) == 2
    with engine.connect() as conn:
        booked = sorted(r[0] for r in conn.execute(text("SELECT request_id FROM usage_events")))
        holds = dict(conn.execute(text("SELECT request_id, state FROM reservations")).all())
    assert booked == ["req_1", "req_2"]
    assert holds == {"req_1": "settled", "req_2": "settled"}
    assert spool.pending() == []
    rejected = list((tmp_path / "var").glob("ledger-rejected-*.jsonl"))
    assert len(rejected) == 1 and b"charged_pi" in rejected[0].read_bytes()


def booked(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(r[0] for r in conn.execute(text("SELECT request_id FROM usage_events")))


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def gone_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(done.stdout)


@pytest.mark.parametrize("claimer", ["{pid}", "{host}-{pid}-0badc0de"], ids=["previous-version", "this-version"])
def test_a_spool_claimed_by_a_process_that_died_mid_replay_is_replayed(engine: Engine, tmp_path: Path, claimer: str) -> None:
    spool = SettlementSpool(tmp_path / "var")
    dead_pid = gone_pid()
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())
    claimer = claimer.format(pid=dead_pid, host=host)

    async def main(ledger: Ledger) -> int:
        await spooled(ledger, spool, 1)
        spool.path.rename(spool.path.with_suffix(f".replaying-{claimer}"))  # claimed, then the claimer crashed
        return await spool.replay(ledger)

    assert with_ledger(engine, main) == 1
    with engine.connect() as conn:
        assert [r[0] for r in conn.execute(text("SELECT request_id FROM usage_events"))] == ["req_1"]
    assert not list((tmp_path / "var").iterdir())  # nothing left to replay, nothing set aside


@pytest.mark.parametrize("claim", ["ledger-spool-replica-b-1-0a1b2c3d.replaying-replica-b-1-0a1b2c3d", "ledger-spool-1.replaying-1"],
                         ids=["this-version", "previous-version"])
def test_a_claim_from_another_host_is_left_alone_while_fresh_and_replayed_once_stale(engine: Engine, tmp_path: Path,
                                                                                     claim: str) -> None:
    """The claimer was pid 1 in another container: its pid cannot be checked from here
    (this container's pid 1 is alive), so its claim is taken over once nobody touches it."""
    var = tmp_path / "var"
    spool = SettlementSpool(var)

    async def main(ledger: Ledger) -> None:
        await spooled(ledger, spool, 1)
        spool.path.rename(var / claim)  # claimed by the other replica a moment ago
        assert await spool.replay(ledger) == 0
        assert booked(engine) == [] and names(var) == [claim], "a live replica's fresh claim is its own"
        age(var / claim, 3600)  # the other replica died an hour ago, mid-replay
        assert await spool.replay(ledger) == 1
        assert await spool.replay(ledger) == 0

    with_ledger(engine, main)
    assert booked(engine) == ["req_1"], "the settlement of a replica that died mid-replay is booked, exactly once"
    assert names(var) == []


def test_a_spool_file_written_by_the_previous_version_is_still_replayed(engine: Engine, tmp_path: Path) -> None:
    var = tmp_path / "var"
    spool = SettlementSpool(var)

    dead_pid = gone_pid()  # not a fixed number: 4242 was alive here once

    async def main(ledger: Ledger) -> int:
        await spooled(ledger, spool, 1)  # the lines themselves are unchanged
        spool.path.rename(var / f"ledger-spool-{dead_pid}.jsonl")  # the previous version's `ledger-spool-<pid>.jsonl`
        return await spool.replay(ledger)

    assert with_ledger(engine, main) == 1
    assert booked(engine) == ["req_1"]
    assert names(var) == []


def test_two_replicas_sharing_the_folder_spool_to_separate_files(engine: Engine, tmp_path: Path) -> None:
    """Two spools in one process have the same host name and pid, as two containers that
    are both pid 1 (or one container, restarted) can: still, never one file for both."""
    var = tmp_path / "var"
    first, second = SettlementSpool(var), SettlementSpool(var)
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())

    async def main(ledger: Ledger) -> int:
        for n, spool in ((1, first), (2, second)):
            await spooled(ledger, spool, n)
        files = sorted(var.glob("ledger-spool-*.jsonl"))
        assert len(files) == 2, f"both replicas appended to {names(var)}"
        assert all(re.fullmatch(rf"ledger-spool-{re.escape(host)}-{os.getpid()}-[0-9a-f]+\.jsonl", f.name) for f in files)
        assert [len(f.read_bytes().splitlines()) for f in files] == [1, 1]
        return await first.replay(ledger), await second.replay(ledger)  # each books its own

    assert with_ledger(engine, main) == (1, 1)
    assert booked(engine) == ["req_1", "req_2"]
    assert names(var) == []


def test_a_slow_replay_keeps_its_claim_fresh_so_no_other_replica_takes_it_over(engine: Engine, tmp_path: Path) -> None:
    var = tmp_path / "var"
    spool, elsewhere = SettlementSpool(var), SettlementSpool(var, host="replica-b")
    seen: list[tuple[list[str], list[Path]]] = []

    class Slow(Ledger):
        async def settle(self, *args: Any, **kwargs: Any) -> bool:
            claims = list(var.glob("*.replaying-*"))
            seen.append(([c.name for c in claims], elsewhere.pending()))
            for claim in claims:
                age(claim, 3600)  # each line takes an hour
            return await super().settle(*args, **kwargs)

    async def main(ledger: Ledger) -> int:
        for n in (1, 2):
            await spooled(ledger, spool, n)
        age(spool.path, 3600)  # spooled an hour ago; a rename keeps that mtime
        return await spool.replay(ledger)

    assert with_ledger(engine, main, kind=Slow) == 2
    claim = f"ledger-spool-{spool.identity}.replaying-{spool.identity}"
    assert seen == [([claim], []), ([claim], [])], "another replica judged a live replay abandoned"
    assert booked(engine) == ["req_1", "req_2"]
    assert names(var) == []


def test_a_live_replicas_spool_file_is_left_to_it_until_it_goes_stale(engine: Engine, tmp_path: Path) -> None:
    """Claiming a file another replica may be appending to would delete a line written
    after the claimer read it; such a file is replayed by its writer, or once abandoned."""
    var = tmp_path / "var"
    spool, elsewhere = SettlementSpool(var), SettlementSpool(var, host="replica-b")

    async def main(ledger: Ledger) -> tuple[int, int]:
        await spooled(ledger, elsewhere, 1)
        while_live = await spool.replay(ledger)
        assert names(var) == [elsewhere.path.name], "the live replica's file must stay where it appends"
        past = time.time() - 2 * spool.stale_after_s
        os.utime(elsewhere.path, (past, past))  # its writer has not touched it for long: gone
        return while_live, await spool.replay(ledger)

    assert with_ledger(engine, main) == (0, 1)
    assert booked(engine) == ["req_1"]
    assert names(var) == []
