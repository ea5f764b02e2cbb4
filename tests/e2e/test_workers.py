"""`gateway serve --workers N` as an operator runs it: N processes behind one port sharing
one budget with the books exact, connections spread over every worker, one that dies
replaced, workers that cannot start or a port in use (by another program or another
gateway) failing the command, all stopped by one SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from gateway.auth.keys import new_api_key
from gateway.cli import STARTUP_FAILURE
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from tests.support.policies import single_model_policy
from tests.support.processes import free_port
from tests.support.servers import run_asgi_in_thread

CONNECTIONS = 24


def children(pid: int) -> list[int]:
    """The worker processes under the gateway (not multiprocessing's resource tracker)."""
    found = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return [c for c in found if b"spawn_main" in _cmdline(c)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # gone meanwhile


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


@contextmanager
def serving(tmp_path: Path, redis_prefix: tuple[str, str], workers: int, extra_env: dict[str, str] | None = None,
            port: int | None = None) -> Iterator[tuple[subprocess.Popen[bytes], str, str]]:
    """`gateway serve --workers N` in front of a simulator; yields (process, its URL, an API key)."""
    key = new_api_key()
    port = port or free_port()
    with ExitStack() as stack:
        hosted = stack.enter_context(run_asgi_in_thread(create_hosted_app(HostedSimConfig())))
        policy = tmp_path / "policy.yaml"
        policy.write_text(single_model_policy(hosted, {"acme": (key, 'budget: {usd: "100.00", period: month}')}))
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # SQLite under GATEWAY_VAR_DIR unless given
        env |= {"REDIS_URL": redis_prefix[0], "GATEWAY_REDIS_PREFIX": redis_prefix[1], "GATEWAY_VAR_DIR": str(tmp_path / "var"),
                **(extra_env or {})}
        log = stack.enter_context((tmp_path / "gateway.log").open("ab"))
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port),
                                 "--workers", str(workers)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield proc, f"http://127.0.0.1:{port}", key
        finally:
            with contextlib.suppress(ProcessLookupError):  # what a failed test left: workers included
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def stopped_cleanly(proc: subprocess.Popen[bytes], log: Path) -> None:
    """One SIGTERM stops the gateway, its workers drained, with status 0."""
    proc.send_signal(signal.SIGTERM)
    status = proc.wait(60)
    assert status == 0, f"status {status}; the gateway's log ends:\n{log.read_text()[-3000:]}"


def answered(response: httpx.Response) -> bool:
    """A 200, or a failed assertion that shows what came instead."""
    assert response.status_code == 200, f"{response.status_code}: {response.text[:500]}"
    return True


def chat(client: httpx.Client, url: str, key: str) -> httpx.Response:
    return client.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                       json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})


@pytest.mark.services
def test_workers_share_the_port_and_the_books_stay_exact(tmp_path: Path, redis_prefix: tuple[str, str]) -> None:
    with serving(tmp_path, redis_prefix, workers=2) as (proc, url, key):
        wait_for(lambda: len(serving_workers(proc.pid, url)) == 2, "both workers serve")
        workers = children(proc.pid)
        replies = []
        for _ in range(CONNECTIONS):
            with httpx.Client(timeout=30) as client:  # a connection each, accepted by either worker
                replies.append(chat(client, url, key))
        assert all(r.status_code == 200 for r in replies), [r.text[:200] for r in replies if r.status_code != 200]

        stopped_cleanly(proc, tmp_path / "gateway.log")
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers), "a worker outlived the gateway"
    with sqlite3.connect(tmp_path / "var" / "ledger.db") as conn:
        reserved, spent = conn.execute("SELECT reserved_pico, spent_pico FROM budgets").fetchone()
        ok, open_holds = conn.execute("SELECT (SELECT count(*) FROM usage_events WHERE status = 'ok'),"
                                      " (SELECT count(*) FROM reservations WHERE state = 'reserved')").fetchone()
    assert (ok, reserved, open_holds) == (CONNECTIONS, 0, 0)
    billed = sum(Decimal(r.headers["x-gateway-cost-usd"]) for r in replies)
    assert Decimal(spent).scaleb(-12) == billed > 0


def sockets_held(port: int, pid: int, state: str) -> int:
    """TCP sockets on local `port` in `state` (01 established, 0A listening) that process `pid` holds."""
    on_port = {line.split()[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
               if int(line.split()[1].rsplit(":", 1)[1], 16) == port and line.split()[3] == state}
    held = set()
    with contextlib.suppress(FileNotFoundError):  # the process is gone
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed meanwhile
                held.add(os.readlink(fd).removeprefix("socket:[").removesuffix("]"))
    return len(on_port & held)


def serving_workers(pid: int, url: str) -> list[int]:
    """The gateway's workers listening on its port: a worker listens once its start-up is
    complete, so these are the ones taking connections."""
    port = int(url.rsplit(":", 1)[1])
    return [child for child in children(pid) if sockets_held(port, child, "0A")]


@pytest.mark.services
@pytest.mark.skipif(sys.platform != "linux", reason="a listening socket per worker is Linux's (gateway/listening.py)")
def test_connections_opened_while_a_worker_is_stalled_still_reach_it(tmp_path: Path, redis_prefix: tuple[str, str]) -> None:
    """A client pool opened in a burst, while one worker is busy (here: stopped), is
    spread over every worker rather than taken by whichever was awake."""
    with serving(tmp_path, redis_prefix, workers=2) as (proc, url, _):
        port = int(url.rsplit(":", 1)[1])
        wait_for(lambda: len(serving_workers(proc.pid, url)) == 2, "both workers serve")
        stalled, awake = children(proc.pid)
        os.kill(stalled, signal.SIGSTOP)
        try:
            pool = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS)]
        finally:
            os.kill(stalled, signal.SIGCONT)
        try:
            for conn in pool:  # every connection answers, whichever worker holds it
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
                assert conn.recv(64).startswith(b"HTTP/1.1 200"), "a connection went unanswered"
            held = {pid: sockets_held(port, pid, "01") for pid in (stalled, awake)}
        finally:
            for conn in pool:
                conn.close()
        assert sum(held.values()) == CONNECTIONS
        assert all(held.values()), f"a worker got none of a burst of {CONNECTIONS} connections: {held}"
        stopped_cleanly(proc, tmp_path / "gateway.log")


@pytest.mark.services
def test_a_worker_that_dies_is_replaced(tmp_path: Path, redis_prefix: tuple[str, str]) -> None:
    with serving(tmp_path, redis_prefix, workers=2) as (proc, url, key):
        wait_for(lambda: len(serving_workers(proc.pid, url)) == 2, "both workers serve")
        victim = children(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: victim not in children(proc.pid) and len(serving_workers(proc.pid, url)) == 2,
                 "a new worker replaces it and serves")
        with httpx.Client(timeout=30) as client:
            assert answered(chat(client, url, key))
        assert proc.poll() is None
        stopped_cleanly(proc, tmp_path / "gateway.log")
    assert f"Child process [{victim}] died" in (tmp_path / "gateway.log").read_text()


@pytest.mark.services
def test_workers_that_cannot_start_stop_the_gateway(tmp_path: Path, redis_prefix: tuple[str, str]) -> None:
    nothing_listens = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
    with serving(tmp_path, redis_prefix, workers=2, extra_env={"DATABASE_URL": nothing_listens}) as (proc, _, _):
        assert proc.wait(120) == STARTUP_FAILURE
    assert "failed to start, stopping the parent process" in (tmp_path / "gateway.log").read_text()


@pytest.mark.services
def test_a_port_in_use_is_refused_at_once(tmp_path: Path, redis_prefix: tuple[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with serving(tmp_path, redis_prefix, workers=2, port=port) as (proc, _, _):
            assert proc.wait(60) == STARTUP_FAILURE
    assert "address already in use" in (tmp_path / "gateway.log").read_text().lower()


@pytest.mark.services
@pytest.mark.skipif(sys.platform != "linux", reason="elsewhere the port itself is refused, as any taken port")
def test_a_second_gateway_on_the_same_port_is_refused(tmp_path: Path, redis_prefix: tuple[str, str]) -> None:
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    with serving(tmp_path / "first", redis_prefix, workers=2) as (first, url, key):
        wait_for(lambda: len(serving_workers(first.pid, url)) == 2, "the first gateway serves")
        port = int(url.rsplit(":", 1)[1])
        with serving(tmp_path / "second", redis_prefix, workers=2, port=port) as (second, _, _):
            assert second.wait(60) == STARTUP_FAILURE
        assert "another gateway serves port" in (tmp_path / "second" / "gateway.log").read_text()
        with httpx.Client(timeout=30) as client:  # the first one is untouched
            assert answered(chat(client, url, key))
        stopped_cleanly(first, tmp_path / "first" / "gateway.log")


@pytest.mark.services
def test_workers_stop_when_the_supervisor_is_killed(tmp_path: Path, redis_prefix: tuple[str, str]) -> None:
    with serving(tmp_path, redis_prefix, workers=2) as (proc, url, key):
        wait_for(lambda: len(serving_workers(proc.pid, url)) == 2, "both workers serve")
        workers = children(proc.pid)
        with httpx.Client(timeout=30) as client:
            for _ in range(4):  # holds made ahead now wait in the workers
                assert answered(chat(client, url, key))
        proc.kill()  # no chance to stop its workers itself
        proc.wait(10)
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), "the workers are gone")
    with socket.socket() as again:
        again.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))  # a gateway started again gets the port
    with sqlite3.connect(tmp_path / "var" / "ledger.db") as conn:
        reserved, open_holds = conn.execute("SELECT (SELECT reserved_pico FROM budgets),"
                                            " (SELECT count(*) FROM reservations WHERE state = 'reserved')").fetchone()
    assert (reserved, open_holds) == (0, 0), "the workers stopped gracefully, giving their holds back"
