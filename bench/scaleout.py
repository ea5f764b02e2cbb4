"""Scale-out: does throughput grow with the CPU given to `--workers N`, and do the books
stay exact when several workers share one budget?

This machine has two cores: one for the gateway, one for the simulator and the load
generator. So the cores are made smaller instead: each gateway worker gets its own CPU
cgroup capped at `--share` of a core (cgroup v1 `cpu.cfs_quota_us`, or v2 `cpu.max`),
all on the gateway's core (bench/placement.py). With N workers the gateway has N such slices. Linear scaling means
N times the throughput of one worker; whatever the workers share (PostgreSQL rows, Redis
buckets, the listening socket) is what would bend the line.

The load grows with N: `--concurrency` is per worker, so that each worker is as busy as
one alone was (with the total fixed, each of N workers would see 1/N of the concurrent
requests, and batch its ledger writes less). Each N gets a fresh PostgreSQL database
and Redis key prefix, which its workers share as replicas in production do. After the load the gateway is stopped (its unused holds go back), and the
ledger is checked: no money or calls left held, the budget's spend equal to the sum of
its usage events, one answered event per answered request.

    .venv/bin/python bench/scaleout.py                       # N = 1,2,3,4, 0.1 core each
    .venv/bin/python bench/scaleout.py --workers 1,2 --duration 4   # a quick look
    .venv/bin/python bench/scaleout.py --workers 1,4 --repeat 3     # medians over three rounds

Needs root (to make cgroups) and PostgreSQL and Redis on 127.0.0.1 (see --database-admin,
--redis-url). Writes bench/out/scaleout-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
import redis
import uvloop

from bench import placement, procs
from bench.gwstack import workspace
from bench.loadgen import CLIENTS, closed_loop
from bench.overhead import Stack, add_load_options, check_load_options
from bench.placement import Placement
from bench.report import args_config, markdown_table, run_header, write_json
from bench.stats import summarize

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
PERIOD_US = 10_000  # short, so a capped worker waits at most ~10 ms for its next slice
COLUMNS = [
    ("round", "round"), ("workers", "workers"), ("CPU given (cores)", "cores"), ("mode", "mode"), ("c", "concurrency"),
    ("req/s", "rps"), ("x one worker", "speedup"), ("per slice vs one", "efficiency"),
    ("gw CPU ms/req", "gateway_cpu_ms_per_req"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
    ("workers throttled s/s", "throttled_s_per_s"), ("load CPU busy %", "load_cpu_busy_pct"),
    ("client connections per worker", "connections"), ("errors", "errors"),
]
SUMMARY_COLUMNS = [
    ("mode", "mode"), ("clients per worker", "per_worker"), ("workers", "workers"), ("rounds", "rounds"),
    ("median req/s", "rps"), ("median x one worker", "speedup"), ("range", "range"),
]
LEDGER_COLUMNS = [
    ("round", "round"), ("workers", "workers"), ("answered", "answered"), ("ok events", "ok_events"),
    ("calls booked", "calls_used"),
    ("spent (USD)", "spent_usd"), ("sum of events (USD)", "events_usd"), ("still held", "reserved_pico"),
    ("open holds", "open_holds"), ("exact", "exact"),
]


class CpuSlices:
    """One CPU cgroup per worker, each capped at `share` of a core; removed on exit."""

    def __init__(self, tag: str, share: float) -> None:
        self.quota_us = max(1000, round(PERIOD_US * share))  # the kernel's floor is 1 ms
        self.share = self.quota_us / PERIOD_US
        self.v1 = (CGROUP_V1 / "cpu.cfs_quota_us").exists()
        self.root = CGROUP_V1 if self.v1 else CGROUP_V2
        self.tag = tag
        self.groups: list[Path] = []

    def check(self) -> None:
        """Raise with the reason if cgroups with CPU quotas cannot be made here."""
        if not self.v1 and "cpu" not in (CGROUP_V2 / "cgroup.subtree_control").read_text(errors="replace").split():
            raise RuntimeError("cgroup v2 without the cpu controller enabled for children of /sys/fs/cgroup")
        probe = self.root / f"{self.tag}-probe"
        probe.mkdir()
        probe.rmdir()

    def confine(self, pid: int) -> None:
        group = self.root / f"{self.tag}-{len(self.groups)}"
        group.mkdir()
        self.groups.append(group)
        if self.v1:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(self.quota_us))
        else:
            (group / "cpu.max").write_text(f"{self.quota_us} {PERIOD_US}")
        (group / "cgroup.procs").write_text(str(pid))  # the whole process, its threads too

    def throttled_s(self) -> float:
        """Seconds the workers spent throttled (waiting for their next slice), summed."""
        total = 0.0
        for group in self.groups:
            for line in (group / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "throttled_time":  # v1, nanoseconds
                    total += int(value) / 1e9
                elif name == "throttled_usec":  # v2
                    total += int(value) / 1e6
        return total

    def remove(self) -> None:
        for group in self.groups:
            if group.exists():
                for pid in (group / "cgroup.procs").read_text().split():  # stragglers back to the root
                    try:
                        (self.root / "cgroup.procs").write_text(pid)
                    except OSError:
                        continue  # exited meanwhile
                group.rmdir()
        self.groups.clear()


def worker_pids(master: int, expected: int) -> list[int]:
    """The processes serving requests: the gateway itself with one worker, else the
    uvicorn workers under it (not its helpers)."""
    if expected == 1:
        return [master]
    workers = []
    for pid in procs.process_tree(master)[1:]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            workers.append(pid)
    return workers


@contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """A new PostgreSQL database for one gateway, dropped afterwards; yields its URL."""
    name = f"gwscale_{secrets.token_hex(6)}"
    with psycopg.connect(f"{admin_url}/postgres", autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{admin_url.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"
    finally:
        with psycopg.connect(f"{admin_url}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def forget_redis_keys(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


def ledger_check(database_url: str, answered: int) -> dict[str, Any]:
    """The books after the gateway has stopped: exact if nothing is left held, the spend
    equals its events, and every answered request has exactly one ok event (plus the one
    answer the start-up check took)."""
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
        budget = conn.execute("SELECT spent_pico, reserved_pico, calls_used, tokens_reserved FROM budgets"
                              " WHERE scope LIKE 'tenant:%'").fetchall()
        events = conn.execute("SELECT count(*) FILTER (WHERE status = 'ok'), count(*), coalesce(sum(cost_pico), 0)"
                              " FROM usage_events").fetchone()
        open_holds = conn.execute("SELECT count(*) FROM reservations WHERE state = 'reserved'").fetchone()
    assert events is not None and open_holds is not None
    if len(budget) != 1:
        return {"answered": answered, "exact": False, "problem": f"{len(budget)} tenant budget rows, expected 1"}
    spent, reserved, calls_used, tokens_reserved = budget[0]
    ok_events, all_events, events_pico = events
    exact = (reserved == 0 and tokens_reserved == 0 and open_holds[0] == 0 and spent == events_pico
             and ok_events == all_events == calls_used == answered + 1)
    return {"answered": answered, "ok_events": ok_events, "events": all_events, "calls_used": calls_used,
            "spent_usd": f"{spent / 10**12:.12f}", "events_usd": f"{events_pico / 10**12:.12f}",
            "reserved_pico": reserved, "open_holds": open_holds[0], "exact": exact}


async def load(stack: Stack, slices: CpuSlices, args: argparse.Namespace, pids: list[int], load_cpu: int
               ) -> tuple[list[dict[str, Any]], int]:
    """Each mode in turn at each concurrency; returns the rows and every answer counted."""
    rows, answered, workers = [], 0, len(pids)
    for mode in args.modes:
        for per_worker in args.concurrency:
            concurrency = per_worker * workers  # each worker as busy as the one alone was
            target = stack.target("gateway", mode == "stream")
            client = CLIENTS[args.client](concurrency)
            try:
                if args.warmup > 0:
                    answered += (await closed_loop(client, target, concurrency, args.warmup, args.max_requests)).completed
                spread = procs.connections_by_process(stack.gateway_port, pids)  # kept open from the warm-up on
                cpu0, busy1, throttled = procs.cpu_seconds(stack.gateway.pid), procs.cpu_busy_seconds(load_cpu), slices.throttled_s()
                samples = await closed_loop(client, target, concurrency, args.duration, args.max_requests)
                answered += samples.completed
                cpu1, busy2, throttled2 = procs.cpu_seconds(stack.gateway.pid), procs.cpu_busy_seconds(load_cpu), slices.throttled_s()
            finally:
                await client.aclose()
            row: dict[str, Any] = {"workers": workers, "cores": round(workers * slices.share, 2), "mode": mode,
                                   "concurrency": concurrency} | summarize(samples)
            elapsed = samples.elapsed_s or 1.0
            row |= {"gateway_cpu_ms_per_req": round((cpu1 - cpu0) * 1000 / max(samples.completed, 1), 3),
                    "load_cpu_busy_pct": round((busy2 - busy1) * 100 / elapsed, 1),
                    "throttled_s_per_s": round((throttled2 - throttled) / elapsed, 3),
                    "connections": "/".join(str(n) for n in spread)}
            print(f"  workers {workers} {mode:10s} c={concurrency:<3d} {row['rps']:9.1f} req/s  p50 {row['p50_ms']:7.2f} ms"
                  f"  load CPU busy {row['load_cpu_busy_pct']:5.1f} %  errors {row['errors']}", file=sys.stderr, flush=True)
            rows.append(row)
    return rows, answered


def run_one(args: argparse.Namespace, workers: int, place: Placement) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    prefix = f"gwscale{secrets.token_hex(4)}"
    slices = CpuSlices(prefix, args.share)
    with fresh_database(args.database_admin) as database_url, workspace("gateway-scaleout-") as workdir, ExitStack() as exits:
        exits.callback(forget_redis_keys, args.redis_url, prefix)
        exits.callback(slices.remove)
        os.environ["GATEWAY_REDIS_PREFIX"] = prefix
        stack_args = argparse.Namespace(workers=workers, token_delay=args.token_delay, latency=args.latency,
                                        no_budget=False, database_url=database_url, redis_url=args.redis_url)
        stack = Stack(stack_args, workdir, exits, place)
        pids = worker_pids(stack.gateway.pid, workers)
        if len(pids) != workers:
            raise RuntimeError(f"expected {workers} worker processes under the gateway, found {len(pids)}")
        for pid in pids:
            slices.confine(pid)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            rows, answered = runner.run(load(stack, slices, args, pids, place.load_cpu))
        stack.gateway.stop()  # its unused holds go back before the books are read
        books = {"workers": workers} | ledger_check(database_url, answered)
    return rows, books


def with_speedup(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    fewest = min(r["workers"] for r in rows)
    base = {(r["mode"], r["concurrency"] // fewest): r for r in rows if r["workers"] == fewest}
    for row in rows:
        one = base[(row["mode"], row["concurrency"] // row["workers"])]
        if one["rps"]:
            ratio = row["rps"] / one["rps"]
            row["speedup"] = round(ratio, 2)
            row["efficiency"] = round(ratio / (row["cores"] / one["cores"]), 2)
    return sorted(rows, key=lambda r: (r["mode"], r["concurrency"] // r["workers"], r["workers"]))


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["mode"], row["concurrency"] // row["workers"], row["workers"]), []).append(row)
    result = []
    for (mode, per_worker, workers), group in sorted(groups.items()):
        ratios = sorted(r["speedup"] for r in group if "speedup" in r)
        result.append({"mode": mode, "per_worker": per_worker, "workers": workers, "rounds": len(group),
                       "rps": round(statistics.median(r["rps"] for r in group), 1),
                       "speedup": round(statistics.median(ratios), 2) if ratios else None,
                       "range": f"{ratios[0]:.2f}-{ratios[-1]:.2f}" if ratios else "-"})
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_options(parser, duration=8.0, concurrency="32")  # --concurrency: per worker here
    parser.add_argument("--workers", default="1,2,3,4", help="comma-separated worker counts (default 1,2,3,4)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every N, alternating (default 1)")
    parser.add_argument("--share", type=float, default=0.1, help="CPU per worker, in cores (default 0.1)")
    parser.add_argument("--database-admin", default=os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432"),
                        help="PostgreSQL server URL, without a database (each run makes and drops its own)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="Redis the workers share (keys under a fresh prefix)")
    args = parser.parse_args(argv)
    check_load_options(parser, args)
    args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    if not args.workers or min(args.workers) < 1 or not 0.01 <= args.share <= 1.0 or args.repeat < 1:
        parser.error("--workers: positive integers; --share: within [0.01, 1]; --repeat: at least 1")
    if max(args.workers) * args.share > 1.0:
        parser.error(f"{max(args.workers)} workers x {args.share} core exceed one core")
    if args.no_pin:
        parser.error("--no-pin: this benchmark confines the workers to slices of one pinned core")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    place = placement.from_args(args)
    if place is None:
        print("error: this benchmark pins processes with taskset and needs two CPUs", file=sys.stderr)
        return 2
    try:
        CpuSlices("gwscale-check", args.share).check()
    except (OSError, RuntimeError) as exc:
        print(f"error: cannot make CPU cgroups here ({exc}); run as root on Linux with the cpu controller", file=sys.stderr)
        return 2
    report: dict[str, Any] = run_header("scaleout", args_config(args) | {"period_us": PERIOD_US})
    report["pinning"] = placement.report(place)
    placement.join_load_core(place)
    rows, books = [], []
    started = time.perf_counter()
    for round_ in range(1, args.repeat + 1):  # every N once per round, so that the machine's drift spreads over all
        measured = []
        for workers in args.workers:
            more, ledger = run_one(args, workers, place)
            measured += more
            books.append({"round": round_} | ledger)
        rows += [{"round": round_} | row for row in with_speedup(measured)]
    report["runs"], report["ledger"] = rows, books
    report["summary"] = summary(rows)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    git, machine = report["git"], report["machine"]
    print(f"\n## Scale-out: gateway workers, {args.share:g} core each ({git['commit']}, {machine['cpu_model']})\n")
    print(markdown_table(COLUMNS, report["runs"]))
    if args.repeat > 1:
        print(f"\n### Over {args.repeat} rounds: the median, and the range, of each round's ratio to its own one worker\n")
        print(markdown_table(SUMMARY_COLUMNS, report["summary"]))
    print("\n### The books after each run (PostgreSQL ledger, gateway stopped)\n")
    print(markdown_table(LEDGER_COLUMNS, books))
    path = write_json("scaleout", report, args.out_dir)
    print(f"\nJSON: {path}")
    return 0 if all(b["exact"] for b in books) and not any(r["errors"] for r in rows) else 1


if __name__ == "__main__":
    procs.run_script(main)
