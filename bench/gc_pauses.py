"""How long the gateway's garbage collections stall it under load, per generation.

A collection runs on the event loop thread and every call in flight waits for it. A
full one (generation 2) walks every object the collector tracks, so its length grows
with what the process holds, start-up's modules and policy included. This starts the
hosted simulator and a gateway whose collections are timed (`gc.callbacks`, installed
before the gateway's CLI runs), drives closed-loop load at `--concurrency`, and reports
each generation's collections: how many, the median and the longest pause, and how
many objects the next full one would walk (and how many are frozen out of it). With `--tree` given twice it runs each checkout
in turn, `--rounds` times, so two versions are compared on the same host in one run.

    .venv/bin/python bench/gc_pauses.py                       # this checkout, c=16, 10 s
    git worktree add /tmp/before <rev> && .venv/bin/python bench/gc_pauses.py --tree /tmp/before --tree .
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from bench import placement, procs
from bench.gwstack import CHAT_PATH, Stack, base_policy, workspace
from bench.loadgen import RawClient, Target, closed_loop
from bench.placement import Placement
from bench.report import add_output_options, args_config, markdown_table, run_header, write_json
from bench.stats import summarize
from bench.workload import chat_body

# Run by the gateway's interpreter (`python -P -c`), from whichever checkout is measured.
TIMED_GATEWAY = """
import gc, json, os, signal, sys, time
pauses, started = {0: [], 1: [], 2: []}, [0.0]
def timed(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        pauses[info["generation"]].append(time.perf_counter() - started[0])
def dump(*_):
    report = {str(g): v for g, v in pauses.items()} | {"walked": len(gc.get_objects()), "frozen": gc.get_freeze_count()}
    with open(os.environ["GC_PAUSES_OUT"] + ".tmp", "w") as out:
        json.dump(report, out)
    os.replace(os.environ["GC_PAUSES_OUT"] + ".tmp", os.environ["GC_PAUSES_OUT"])
    for v in pauses.values():
        v.clear()
gc.callbacks.append(timed)
signal.signal(signal.SIGUSR1, dump)
from gateway.cli import main
sys.exit(main(sys.argv[1:]))
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", type=Path, help="a checkout to run the gateway from (default: this one)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per checkout, alternating (default 2)")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop concurrency (default 16)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each run (default 2)")
    parser.add_argument("--stream", action="store_true", help="streamed calls instead of plain ones")
    add_output_options(parser, pinning=True)
    args = parser.parse_args(argv)
    args.tree = [t.resolve() for t in args.tree or [Path(__file__).resolve().parent.parent]]
    if not 1 <= args.rounds <= 20 or args.concurrency < 1 or args.duration <= 0 or args.warmup < 0:
        parser.error("--rounds from 1 to 20, --concurrency 1 or more, --duration above 0, --warmup 0 or more")
    return args


def one_run(tree: Path, workdir: Path, exits: ExitStack, place: Placement | None, sim_port: int, tag: str,
            args: argparse.Namespace, runner: asyncio.Runner) -> dict[str, Any]:
    """One gateway from `tree`, its collections timed (TIMED_GATEWAY), under load."""
    stack = Stack(workdir, exits, place, tag=tag)
    out = workdir / f"gc{tag}.json"
    os.environ["GC_PAUSES_OUT"] = str(out)
    stack.start_gateway(base_policy(sim_port, stack.digest), tree=tree, code=TIMED_GATEWAY)
    assert stack.gateway is not None
    target = Target("gateway", stack.gateway_port, CHAT_PATH, stack.api_key, args.stream, chat_body(args.stream))
    try:
        runner.run(closed_loop(RawClient(args.concurrency), target, args.concurrency, args.warmup, 10**9))
        procs.ask_for_json(stack.gateway, out)  # start-up and warm-up out
        samples = runner.run(closed_loop(RawClient(args.concurrency), target, args.concurrency, args.duration, 10**9))
        pauses = procs.ask_for_json(stack.gateway, out)
    finally:
        stack.gateway.stop()
    row: dict[str, Any] = {"tree": str(tree), "walked_by_a_full_one": pauses["walked"], "frozen": pauses["frozen"],
                           **{k: v for k, v in summarize(samples).items() if k in ("rps", "p99_ms", "p999_ms", "max_ms")}}
    for generation in ("0", "1", "2"):
        ms = sorted(1000 * s for s in pauses[generation])
        row[f"gen{generation}"] = len(ms)
        row[f"gen{generation}_median_ms"] = round(ms[len(ms) // 2], 2) if ms else None
        row[f"gen{generation}_max_ms"] = round(ms[-1], 2) if ms else None
    return row


COLUMNS = [("checkout", "tree"), ("req/s", "rps"), ("p99.9 ms", "p999_ms"), ("max ms", "max_ms"),
           ("gen 0 / 1 / 2 collections", "counts"), ("gen 0 median / max ms", "gen0_ms"),
           ("gen 1 median / max ms", "gen1_ms"), ("gen 2 median / max ms", "gen2_ms"),
           ("objects a full one walks", "walked_by_a_full_one"), ("frozen", "frozen")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    place = placement.from_args(args)
    config = args_config(args) | {"tree": [str(t) for t in args.tree], "pinning": placement.report(place)}
    report: dict[str, Any] = run_header("gc-pauses", config)
    rows: list[dict[str, Any]] = []
    with workspace("gateway-gc-") as workdir, ExitStack() as exits, asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        sim_port = Stack(workdir, exits, place).start_simulator([])
        placement.join_load_core(place)
        for round_ in range(args.rounds):
            trees = args.tree if round_ % 2 == 0 else list(reversed(args.tree))
            for i, tree in enumerate(trees):
                rows.append(one_run(tree, workdir, exits, place, sim_port, f"-{round_}-{i}", args, runner))
    for r in rows:
        r["counts"] = f"{r['gen0']} / {r['gen1']} / {r['gen2']}"
        for g in "012":
            r[f"gen{g}_ms"] = f"{r[f'gen{g}_median_ms']} / {r[f'gen{g}_max_ms']}"
    report["runs"] = rows
    print(markdown_table(COLUMNS, rows))
    print(f"\nJSON: {write_json('gc-pauses', report, args.out_dir)}")
    return 0


if __name__ == "__main__":
    procs.run_script(main)
