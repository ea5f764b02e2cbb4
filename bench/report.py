"""What a benchmark run leaves behind: the machine it ran on, Markdown tables for the
terminal, and a JSON file under bench/out/."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import placement

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "bench" / "out"


def run_header(benchmark: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """How every report starts: the benchmark, the exact command, the commit, the machine
    and the configuration it ran with."""
    return {"benchmark": benchmark, "command": shlex.join(sys.orig_argv), "git": git_commit(), "machine": machine_info(),
            "config": dict(config)}


def add_output_options(parser: argparse.ArgumentParser, *, pinning: bool) -> None:
    """`--out-dir`, which every benchmark takes, and `--no-pin` and `--gateway-cpu` for
    those that pin their processes to CPUs (bench/placement.py)."""
    if pinning:
        parser.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs with taskset")
        parser.add_argument("--gateway-cpu", type=placement.cpu_option, default=None,
                            help="the gateway's core (default: the one that takes the ledger disk's interrupts, else the"
                                 " first); the simulator and load generator get another")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR, help="where the JSON goes")


def args_config(args: argparse.Namespace) -> dict[str, Any]:
    """Command-line options as JSON-ready values."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def git_commit() -> dict[str, Any]:
    """Read-only git queries (`--no-optional-locks`: no index refresh is written)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "--no-optional-locks", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    changes = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "--short", "HEAD"), "tracked_changes": bool(changes) if changes is not None else None}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": list(os.getloadavg()),
    }


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def markdown_table(columns: Sequence[tuple[str, str]], rows: Iterable[Mapping[str, Any]]) -> str:
    """`columns`: (header, key) pairs; missing or NaN values print as `-`."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(row.get(key)) for _, key in columns) + " |" for row in rows]
    return "\n".join(lines)


RUN_COLUMNS = [
    ("target", "target"), ("mode", "mode"), ("conc", "concurrency"), ("req/s", "rps"),
    ("p50 ms", "p50_ms"), ("p90 ms", "p90_ms"), ("p99 ms", "p99_ms"), ("p99.9 ms", "p999_ms"), ("max ms", "max_ms"),
    ("TTFT p50 ms", "ttft_p50_ms"), ("errors", "errors"), ("gw CPU ms/req", "gateway_cpu_ms_per_req"),
    ("of it, loop / other threads", "gateway_cpu_split"), ("sim CPU ms/req", "sim_cpu_ms_per_req"),
    ("loadgen CPU %", "loadgen_cpu_pct"), ("gw CPU %", "gateway_cpu_pct"), ("others on gw's CPU %", "core_others_pct"),
]
OVERHEAD_COLUMNS = [
    ("mode", "mode"), ("conc", "concurrency"), ("added p50 ms", "added_p50_ms"), ("added p99 ms", "added_p99_ms"),
    ("added TTFT p50 ms", "added_ttft_p50_ms"), ("throughput gw/direct", "throughput_ratio"),
    ("gw CPU ms/req", "gateway_cpu_ms_per_req"), ("ledger commits/s", "ledger_commits_per_s"),
    ("ledger ops/commit", "ledger_ops_per_commit"),
]


def _json_safe(value: Any) -> Any:
    """NaN is not JSON: write null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def write_json(name: str, report: Mapping[str, Any], out_dir: Path = OUT_DIR) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(_json_safe(dict(report)), indent=2) + "\n")
    return path
