"""Shared by bench/cache.py, bench/trace_replay.py and bench/startup.py: start the
hosted simulator and a gateway in front of it with a given policy, talk to them over HTTP/1.1 with the
response headers kept, and always stop them.

Everything here talks to 127.0.0.1 only.
"""

from __future__ import annotations

import http.client
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, NoReturn

import orjson
import yaml

from bench import placement, procs
from bench.http1 import Http1Connection, OnChunk, build_request
from bench.placement import Placement
from gateway.auth.keys import key_digest, new_api_key

READY_TIMEOUT_S = 60.0
SIM_KEY = "sk-sim-bench"
CHAT_PATH = "/v1/chat/completions"
MODEL = "bench-model"
PRICE = {"input": 0.15, "cached_input": 0.075, "output": 0.60}  # USD per 1M tokens


def _raise_interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt(f"signal {signum}")


def install_signal_handlers() -> None:
    """Ctrl-C and SIGTERM both unwind through the finally blocks that stop the children."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)


@contextmanager
def workspace(prefix: str) -> Iterator[Path]:
    """A temporary folder for logs, policies and GATEWAY_VAR_DIR; kept (and printed) on failure."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    except BaseException:
        print(f"logs kept in {path}", file=sys.stderr)
        raise
    shutil.rmtree(path, ignore_errors=True)


def base_policy(sim_port: int, digest: str) -> dict[str, Any]:
    """One upstream (the simulator), `bench-model` at the brief's price, tenant `acme`
    with a large budget (so the durable reserve-then-settle is on the measured path)."""
    return {
        "version": 1,
        "upstreams": {"local": {"kind": "openai", "base_url": f"http://127.0.0.1:{sim_port}/v1",
                                "api_key_env": "BENCH_SIM_API_KEY"}},
        "models": {MODEL: {"upstream": "local", "price": dict(PRICE)}},
        "tenants": {"acme": {"api_keys": [digest], "budget": {"usd": "1000000.00", "period": "month"}}},
    }


class Stack:
    """The simulator and a gateway, each stopped by `exits` (an ExitStack the caller closes)."""

    def __init__(self, workdir: Path, exits: ExitStack, place: Placement | None, tag: str = "") -> None:
        self.workdir, self.exits, self.place, self.tag = workdir, exits, place, tag
        self.api_key = new_api_key()
        self.admin_key = "adm-" + secrets.token_hex(16)
        self.sim_port = self.gateway_port = 0
        self.sim: procs.Spawned | None = None
        self.gateway: procs.Spawned | None = None

    @property
    def digest(self) -> str:
        return key_digest(self.api_key)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], cpu: int | None, tree: Path | None = None,
               module: str = "gateway", code: str | None = None) -> procs.Spawned:
        """`tree`: a checkout to run the gateway from (-P: its PYTHONPATH comes before the
        working directory and this venv's own install), instead of this one. `module`:
        what `python -m` runs (`bench.probe` wraps the gateway's CLI); `code`, if given,
        what `python -c` runs instead (a wrapper that must run from any checkout)."""
        run = ["-m", module] if code is None else ["-c", code]
        python = [sys.executable, *run] if tree is None else [sys.executable, "-P", *run]
        if tree is not None:
            env = env | {"PYTHONPATH": str(tree)}
        proc = procs.Spawned(f"{name}{self.tag}", [*python, *argv], env, self.workdir, cpu)
        self.exits.callback(proc.stop)
        return proc

    def start_simulator(self, extra: Sequence[str]) -> int:
        self.sim_port = procs.free_port()
        argv = ["sim", "hosted", "--host", "127.0.0.1", "--port", str(self.sim_port), *extra]
        self.sim = self._spawn("simulator", argv, dict(os.environ), placement.load_core(self.place))
        procs.wait_until(self.sim, self.sim_port, "GET", "/v1/models", READY_TIMEOUT_S)
        return self.sim_port

    def start_gateway(self, policy: dict[str, Any], tree: Path | None = None, module: str = "gateway",
                      code: str | None = None) -> float:
        """Writes the policy next to the logs; returns seconds from spawn to /healthz 200.
        `tree`, `module`, `code`: run the gateway from that checkout, through that module
        or code (see `_spawn`)."""
        self.gateway_port = procs.free_port()
        path = self.workdir / f"policy{self.tag}.yaml"
        path.write_text(yaml.safe_dump(policy, sort_keys=False))
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "GATEWAY_POLICY")}
        env |= {"GATEWAY_VAR_DIR": str(self.workdir / f"var{self.tag}"), "BENCH_SIM_API_KEY": SIM_KEY,
                "GATEWAY_ADMIN_KEY": self.admin_key}
        argv = ["serve", "--policy", str(path), "--host", "127.0.0.1", "--port", str(self.gateway_port)]
        self.gateway = self._spawn("gateway", argv, env, placement.gateway_core(self.place), tree, module, code)
        return procs.wait_until(self.gateway, self.gateway_port, "GET", "/healthz", READY_TIMEOUT_S)

    def client_headers(self) -> dict[str, str]:
        return {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"}

    def sim_stats(self) -> dict[str, Any]:
        return get_json(self.sim_port, "/sim/stats")

    def admin_costs(self, group_by: str = "tenant") -> dict[str, Any]:
        return get_json(self.gateway_port, f"/admin/costs?group_by={group_by}",
                        {"Authorization": f"Bearer {self.admin_key}"})

    def cpu_seconds(self) -> dict[str, float]:
        return {"gateway": procs.cpu_seconds(self.gateway.pid) if self.gateway else 0.0,
                "simulator": procs.cpu_seconds(self.sim.pid) if self.sim else 0.0}


def get_json(port: int, path: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10.0)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {path} on :{port} answered {response.status}: {body[:300]!r}")
        result: dict[str, Any] = orjson.loads(body)
        return result
    finally:
        conn.close()




class ConnectionPool:
    """Idle keep-alive connections to one port; a new one whenever none is idle.

    A connection idle for longer than `max_idle_s` is closed instead of reused: uvicorn
    closes keep-alive connections after 5 s idle, and a request written just as the
    server closes it fails with IncompleteReadError (a client artefact, not the server's
    error). Open-loop replays at low rates leave connections idle that long."""

    def __init__(self, port: int, max_idle_s: float = 2.0) -> None:
        self.port = port
        self.max_idle_s = max_idle_s
        self._idle: list[tuple[Http1Connection, float]] = []
        self.opened = 0

    def _acquire(self) -> Http1Connection:
        now = time.monotonic()
        while self._idle:
            conn, since = self._idle.pop()
            if now - since <= self.max_idle_s:
                return conn
            conn.close()
        self.opened += 1
        return Http1Connection("127.0.0.1", self.port)

    async def post(self, path: str, body: bytes, headers: dict[str, str], on_chunk: OnChunk) -> tuple[int, dict[str, str]]:
        raw = build_request("127.0.0.1", self.port, path, body, headers)
        conn = self._acquire()
        try:
            return await conn.exchange(raw, on_chunk)
        finally:
            self._idle.append((conn, time.monotonic()))

    def close(self) -> None:
        for conn, _ in self._idle:
            conn.close()
        self._idle.clear()
