"""Where a call's time goes at c=1, with the budget hold and without it.

At one call at a time the gateway's core is mostly busy, and what it adds is no longer
just its own CPU: the upstream's core idles between calls, and the ledger writer shares
the gateway's core. This runs the gateway through `bench/probe.py` (timestamps on the
call's path, CPU per thread) in front of the hosted simulator, a tenant with a budget
and one without alternating (`--pairs` times, swapping which goes first), and a direct
baseline each time. Prints one row per run and writes bench/out/c1-split-<timestamp>.json.

    .venv/bin/python bench/c1_split.py               # 3 pairs, 5 s per run, both modes
    .venv/bin/python bench/c1_split.py --pairs 1 --duration 2 --modes non-stream
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from bench import placement, procs
from bench.gwstack import CHAT_PATH, SIM_KEY, Stack, base_policy, workspace
from bench.loadgen import RawClient, Target, closed_loop
from bench.placement import Placement
from bench.report import ROOT, add_output_options, args_config, markdown_table, run_header, write_json
from bench.stats import added_latency, summarize
from bench.workload import chat_body

MODES = ("non-stream", "stream")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="budget / no-budget pairs (default 3)")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each run (default 1)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: non-stream, stream")
    add_output_options(parser, pinning=True)
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        parser.error(f"--modes: a comma-separated subset of {', '.join(MODES)}")
    if not 1 <= args.pairs <= 50 or args.duration <= 0 or args.warmup < 0:
        parser.error("--pairs from 1 to 50, --duration above 0, --warmup 0 or more")
    return args


async def measure(target: Target, warmup_s: float, duration_s: float, around: Callable[[], None]) -> dict[str, Any]:
    """Closed loop at c=1: `around()` runs right before and right after the measured part."""
    client = RawClient(1)
    try:
        if warmup_s:
            await closed_loop(client, target, 1, warmup_s, 10**9)
        around()
        samples = await closed_loop(client, target, 1, duration_s, 10**9)
        around()
    finally:
        await client.aclose()
    return summarize(samples)


class Probed:
    """A gateway started through bench/probe.py; `dump()` asks it for its figures."""

    def __init__(self, stack: Stack, out: Path) -> None:
        self.stack, self.out = stack, out
        self.last: dict[str, Any] = {}  # what the latest dump held

    def dump(self) -> None:
        assert self.stack.gateway is not None
        self.last = procs.ask_for_json(self.stack.gateway, self.out)


def one_run(workdir: Path, exits: ExitStack, place: Placement | None, sim_port: int, tag: str, budget: bool,
            args: argparse.Namespace, runner: asyncio.Runner) -> list[dict[str, Any]]:
    stack = Stack(workdir, exits, place, tag=tag)
    policy = base_policy(sim_port, stack.digest)
    if not budget:
        del policy["tenants"]["acme"]["budget"]
    out = workdir / f"probe{tag}.json"
    os.environ["PROBE_OUT"] = str(out)
    stack.start_gateway(policy, module="bench.probe")
    assert stack.gateway is not None
    probed = Probed(stack, out)
    rows = []
    try:
        for mode in args.modes:
            stream = mode == "stream"
            direct = runner.run(measure(Target("direct", sim_port, CHAT_PATH, SIM_KEY, stream, chat_body(stream)),
                                        args.warmup, args.duration, lambda: None))
            target = Target("gateway", stack.gateway_port, CHAT_PATH, stack.api_key, stream, chat_body(stream))
            client = runner.run(measure(target, args.warmup, args.duration, probed.dump))
            rows.append(row(budget, mode, direct, client, probed.last))
    finally:
        stack.gateway.stop()
    return rows


def row(budget: bool, mode: str, direct: dict[str, Any], client: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    calls = max(client["completed"], 1)
    cpu = figures.get("thread_cpu_s", {})
    return {
        "budget": "yes" if budget else "no", "mode": mode, "rps": client["rps"], "errors": client["errors"],
        "p50_ms": client["p50_ms"], **added_latency(direct, client),
        **{key: figures.get(key) for key in ("request_to_upstream_us", "upstream_us", "upstream_to_first_write_us",
                                             "reserve_median_us", "reserve_p90_us")},
        "waited_pct": round(100 * figures.get("draws_waiting_for_the_commit", 0) / figures["draws"], 1) if figures.get("draws") else None,
        "loop_cpu_ms": round(cpu.get("MainThread", 0.0) * 1e3 / calls, 3),
        "writer_cpu_ms": round(cpu.get("ledger-writer", 0.0) * 1e3 / calls, 3),
        "direct": direct, "client": client, "probe": figures,
    }


COLUMNS = [("budget", "budget"), ("mode", "mode"), ("req/s", "rps"), ("p50 ms", "p50_ms"),
           ("added p50 ms", "added_p50_ms"), ("added TTFT ms", "added_ttft_p50_ms"),
           ("request -> upstream us", "request_to_upstream_us"), ("upstream us", "upstream_us"),
           ("upstream -> first write us", "upstream_to_first_write_us"), ("hold median / p90 us", "hold"),
           ("waited for the hold's commit %", "waited_pct"), ("loop CPU ms/call", "loop_cpu_ms"),
           ("writer CPU ms/call", "writer_cpu_ms")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    place = placement.from_args(args)
    report: dict[str, Any] = run_header("c1-split", args_config(args) | {"pinning": placement.report(place)})
    os.environ["PYTHONPATH"] = str(ROOT)  # `python -m bench.probe` from the gateway's working directory
    rows: list[dict[str, Any]] = []
    with workspace("gateway-c1-") as workdir, ExitStack() as exits, asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        simulator = Stack(workdir, exits, place)
        sim_port = simulator.start_simulator([])
        placement.join_load_core(place)
        for pair in range(args.pairs):
            for budget in (True, False) if pair % 2 == 0 else (False, True):
                rows += one_run(workdir, exits, place, sim_port, f"-{pair}-{'b' if budget else 'n'}", budget, args, runner)
    for r in rows:
        r["hold"] = f"{r['reserve_median_us']} / {r['reserve_p90_us']}" if r["budget"] == "yes" else "-"
    report["runs"] = rows
    print(markdown_table(COLUMNS, rows))
    print(f"\nJSON: {write_json('c1-split', report, args.out_dir)}")
    return 0


if __name__ == "__main__":
    procs.run_script(main)
