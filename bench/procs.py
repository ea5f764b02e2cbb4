"""Subprocesses under test: spawn (optionally pinned with taskset), wait until they
answer, read their CPU time and memory from /proc, and always terminate them."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import venv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

POLL_INTERVAL_S = 0.02
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def can_pin() -> bool:
    return shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2


def pin_prefix(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None else []


class Spawned:
    """A child in its own session, output to a log file; `stop()` ends it by pid."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_dir: Path, cpu: int | None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen([*pin_prefix(cpu), *argv], env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; last output:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the child's own process group (its uvicorn workers too), then SIGKILL."""
        if self.proc.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._log.close()


def http_status(port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> int | None:
    """One request to 127.0.0.1; None when nothing answers yet."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status
    except OSError:
        return None
    finally:
        conn.close()


def wait_until(proc: Spawned, port: int, method: str, path: str, timeout_s: float,
               body: bytes | None = None, headers: dict[str, str] | None = None) -> float:
    """Poll until a 200; seconds since the process was spawned."""
    deadline = time.perf_counter() + timeout_s
    last: int | None = None
    while time.perf_counter() < deadline:
        proc.check_alive()
        last = http_status(port, method, path, body, headers)
        if last == 200:
            return time.perf_counter() - proc.started_at
        time.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"{proc.name}: no 200 from {method} {path} within {timeout_s:.0f}s (last status {last});"
                       f" last output:\n{proc.log_tail()}")


def process_tree(pid: int) -> list[int]:
    """The pid and its descendants (uvicorn --workers N runs N children)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo += [int(child) for child in task.read_text().split()]
            except OSError:
                continue
    return pids


def cpu_seconds(pid: int, *, main_threads: bool = False) -> float:
    """utime + stime of the process tree, from /proc/<pid>/stat; `main_threads`: of each
    process's main thread alone (the gateway's event loop), from its task's stat."""
    total = 0
    for member in process_tree(pid):
        path = f"/proc/{member}/task/{member}/stat" if main_threads else f"/proc/{member}/stat"
        try:
            stat = Path(path).read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / CLK_TCK


def connections_by_process(port: int, pids: Sequence[int]) -> list[int]:
    """How many established TCP connections to local `port` each of `pids` holds
    (IPv4, from /proc/net/tcp and each process's open sockets)."""
    ours = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # 01: ESTABLISHED
            ours.add(fields[9])  # the socket's inode
    counts = []
    for pid in pids:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue  # closed meanwhile
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        counts.append(len(inodes & ours))
    return counts


def memory_kib(pid: int, field: str = "VmRSS") -> int:
    """A /proc/<pid>/status field (VmRSS, VmHWM), summed over the process tree."""
    total = 0
    for member in process_tree(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def cpu_busy_seconds(cpu: int) -> float:
    """Non-idle time of one CPU since boot (all processes), from /proc/stat."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            ticks = [int(v) for v in line.split()[1:]]
            idle = ticks[3] + ticks[4]  # idle + iowait
            guest = sum(ticks[8:])  # guest time is already counted in user
            return (sum(ticks) - idle - guest) / CLK_TCK
    raise ValueError(f"no cpu{cpu} in /proc/stat")


def run_script(main: Callable[[], int]) -> NoReturn:
    """A bench script's entry point: its exit status, or 130 after Ctrl-C (its
    subprocesses are stopped by the finally blocks on the way out)."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; subprocesses stopped", file=sys.stderr)
        sys.exit(130)


def venv_package_version(venv_dir: Path, package: str) -> str | None:
    """The version of `package` installed in the venv at `venv_dir`, or None."""
    python = venv_dir / "bin" / "python"
    if not python.exists():
        return None
    done = subprocess.run([str(python), "-m", "pip", "show", package], capture_output=True, text=True, timeout=120)
    for line in done.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return None


def pip_install(venv_dir: Path, args: Sequence[str], timeout_s: float) -> None:
    """`pip install <args>` into the venv at `venv_dir`, creating it first if needed."""
    if not (venv_dir / "bin" / "python").exists():
        venv_dir.parent.mkdir(parents=True, exist_ok=True)
        venv.EnvBuilder(with_pip=True, clear=False).create(venv_dir)
    python = str(venv_dir / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *args],
                   check=True, timeout=timeout_s)


def ask_for_json(proc: Spawned, out: Path, timeout_s: float = 5.0) -> dict[str, Any]:
    """SIGUSR1 to `proc` (a gateway run through a probe), then the JSON it writes to
    `out` in answer: read once the file has changed and parses whole."""
    before = out.stat().st_mtime_ns if out.exists() else 0
    os.kill(proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while True:
        if out.exists() and out.stat().st_mtime_ns != before:
            try:
                report: dict[str, Any] = json.loads(out.read_text())
                return report
            except json.JSONDecodeError:
                pass  # still being written
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.name} wrote nothing to {out}; its log:\n{proc.log_tail()}")
        time.sleep(0.02)
