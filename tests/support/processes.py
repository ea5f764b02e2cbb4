"""Gateway replicas and vLLM simulators as real OS processes (`python -m gateway ...`),
for tests that need several replicas sharing PostgreSQL and Redis, or a SIGKILL mid-load."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChildProcess:
    """A child process of the test, on a free port, its output in `log_path`: started,
    waited for until `health_url` answers 200, and stopped or SIGKILLed."""

    what = "process"

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def spawn(self, args: list[str], env: dict[str, str] | None = None) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway", *args], env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_healthy(self, health_url: str, timeout_s: float) -> None:
        assert self.proc is not None, "not spawned"
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.what} exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(health_url, timeout=1).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.what} did not come up: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no settling - a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


class GatewayProcess(ChildProcess):
    what = "gateway"

    def __init__(self, policy: Path, env: dict[str, str], log_path: Path) -> None:
        super().__init__(log_path)
        self.policy, self.env = policy, env

    @property
    def url(self) -> str:
        return self.root

    def start(self, timeout_s: float = 30.0) -> None:
        self.spawn(["serve", "--policy", str(self.policy), "--port", str(self.port), "--log-level", "warning"],
                   {**os.environ, **self.env})
        self.wait_healthy(self.url + "/healthz", timeout_s)


@contextlib.contextmanager
def gateway_processes(count: int, policy: Path, env: dict[str, str], log_dir: Path) -> Iterator[list[GatewayProcess]]:
    procs = [GatewayProcess(policy, env, log_dir / f"gateway-{i}.log") for i in range(count)]
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            proc.stop()


class VllmReplicaProcess(ChildProcess):
    """One vLLM simulator (`python -m gateway sim vllm`) as its own OS process, so a
    test can SIGKILL it the way a GPU node dies: no goodbye on any connection."""

    what = "simulator"

    def __init__(self, flags: list[str], log_path: Path) -> None:
        super().__init__(log_path)
        self.flags = flags

    @property
    def url(self) -> str:
        """As a pool's `replicas` list names it."""
        return self.root + "/v1"

    def spawn_replica(self) -> None:
        self.spawn(["sim", "vllm", "--port", str(self.port), *self.flags])

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        self.wait_healthy(self.root + "/health", timeout_s)


@contextlib.contextmanager
def vllm_replicas(count: int, flags: list[str], log_dir: Path) -> Iterator[list[VllmReplicaProcess]]:
    """`count` simulator processes, started together, each stopped afterwards."""
    replicas = [VllmReplicaProcess(flags, log_dir / f"replica-{i}.log") for i in range(count)]
    try:
        for replica in replicas:
            replica.spawn_replica()
        for replica in replicas:
            replica.wait_ready()
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()
