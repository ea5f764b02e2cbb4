"""One call at a time, alternating call by call between the simulator and gateways from
two checkouts: what a change does to a call's latency and its time to first token.

`paired.py` alternates blocks of calls. On this project's shared machines the speed
drifts within seconds, and blocks of a few hundred calls differ by as much as the
changes worth measuring (0.03-0.1 ms). Here every call to a gateway follows a direct
call, and the two gateways take turns call by call: round k is direct, A, direct, B
when k is even and direct, B, direct, A when it is odd, so that each gateway's call
follows its own previous one as often as the other's. (Three gateways in a fixed
rotation were tried: the middle one, which never follows itself, came out 0.1-0.2 ms
faster than an identical build.) Both gateways share one core, only one of them busy
at a time; the simulator and the load generator run on the other. Same simulator,
policy (a tenant budget), request and placement as `overhead.py`.

A call to the gateway comes a direct call's time after the last one - a few
milliseconds, longer than the gateway's 2 ms delay for deferred books - so this also
shows what a closed loop at c=1 hides: work the gateway does between calls meeting the
next one.

    .venv/bin/python bench/interleave.py --tree /tmp/before --tree .
    .venv/bin/python bench/interleave.py --tree . --tree .           # A/A: the harness's own spread
    .venv/bin/python bench/interleave.py --calls 500 --modes non-stream --tree . --tree .
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from bench import placement, procs
from bench.gwstack import CHAT_PATH, SIM_KEY, Stack, base_policy, install_signal_handlers, workspace
from bench.loadgen import RawClient, Target, one_request
from bench.report import add_output_options, args_config, markdown_table, run_header, write_json
from bench.stats import RunSamples
from bench.workload import chat_body

MODES = ("non-stream", "stream")
GATEWAYS = ("a", "b")
COLUMNS = [("mode", "mode"), ("figure", "figure"), ("direct ms", "direct_ms"), ("A ms", "a_ms"), ("B ms", "b_ms"),
           ("A added ms", "a_added_ms"), ("B added ms", "b_added_ms"), ("B - A ms", "b_minus_a_ms"),
           ("B - A, 1st / 2nd half ms", "halves")]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", default=[], type=Path,
                        help="a checkout to run a gateway from; give it twice (A, then B). Default: this one, twice")
    parser.add_argument("--calls", type=int, default=2000, help="measured calls per gateway and mode (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured rounds first (default 200)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: non-stream, stream")
    add_output_options(parser, pinning=True)
    args = parser.parse_args(argv)
    args.tree = args.tree or [Path("."), Path(".")]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if len(args.tree) != 2:
        parser.error("--tree: give two checkouts (the same one twice for an A/A run)")
    if missing := [str(t) for t in args.tree if not (t / "gateway" / "__main__.py").is_file()]:
        parser.error(f"--tree: not a checkout of this project: {', '.join(missing)}")
    if not args.modes or any(m not in MODES for m in args.modes):
        parser.error(f"--modes: a comma-separated subset of {', '.join(MODES)}")
    if not 10 <= args.calls <= 1_000_000 or not 0 <= args.warmup <= 100_000:
        parser.error("--calls within [10, 1000000], --warmup within [0, 100000]")
    args.tree = [t.resolve() for t in args.tree]
    return args


def schedule(rounds: int) -> Iterator[str]:
    """Who takes each call: direct before every gateway call, the gateways' order
    swapped every round."""
    for k in range(rounds):
        first, second = GATEWAYS if k % 2 == 0 else GATEWAYS[::-1]
        yield from ("direct", first, "direct", second)


async def run_mode(targets: dict[str, Target], calls: int, warmup: int) -> dict[str, RunSamples]:
    clients = {name: RawClient(1) for name in targets}
    samples = {name: RunSamples() for name in targets}
    try:
        for name in schedule(warmup):
            await one_request(clients[name], targets[name], RunSamples())
        for name in schedule(calls):
            await one_request(clients[name], targets[name], samples[name])
    finally:
        for client in clients.values():
            await client.aclose()
    return samples


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3) if values else float("nan")


def _halves(values: list[float]) -> tuple[list[float], list[float]]:
    """The run's first and second half, in the order the calls were made."""
    return values[: len(values) // 2], values[len(values) // 2 :]


def summary(mode: str, samples: dict[str, RunSamples]) -> list[dict[str, Any]]:
    figures = [("p50", "latencies_s")] + ([("TTFT p50", "ttfts_s")] if mode == "stream" else [])
    rows = []
    for figure, field in figures:
        series = {name: getattr(s, field) for name, s in samples.items()}
        med = {name: _median_ms(values) for name, values in series.items()}
        halves = [round(_median_ms(b) - _median_ms(a), 3)
                  for a, b in zip(_halves(series["a"]), _halves(series["b"]), strict=True)]
        rows.append({"mode": mode, "figure": figure, "direct_ms": med["direct"], "a_ms": med["a"], "b_ms": med["b"],
                     "a_added_ms": round(med["a"] - med["direct"], 3), "b_added_ms": round(med["b"] - med["direct"], 3),
                     "b_minus_a_ms": round(med["b"] - med["a"], 3), "halves": f"{halves[0]} / {halves[1]}"})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    report: dict[str, Any] = run_header("interleave", args_config(args) | {"tree": [str(t) for t in args.tree]})
    errors = 0
    with workspace("gateway-interleave-") as workdir, ExitStack() as exits, \
            asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        place = placement.from_args(args)
        sim = Stack(workdir, exits, place)
        sim_port = sim.start_simulator(["--token-delay", "0", "--latency", "0"])
        gateways = {}
        for name, tree in zip(GATEWAYS, args.tree, strict=True):
            gateways[name] = Stack(workdir, exits, place, tag=f"-{name}")
            gateways[name].start_gateway(base_policy(sim_port, gateways[name].digest), tree=tree)
        placement.join_load_core(place)
        report["pinning"] = placement.report(place)
        print(placement.describe(report["pinning"]), file=sys.stderr, flush=True)
        rows, raw = [], {}
        for mode in args.modes:
            stream = mode == "stream"
            targets = {"direct": Target("direct", sim_port, CHAT_PATH, SIM_KEY, stream, chat_body(stream))}
            targets |= {name: Target(name, g.gateway_port, CHAT_PATH, g.api_key, stream, chat_body(stream))
                        for name, g in gateways.items()}
            samples = runner.run(run_mode(targets, args.calls, args.warmup))
            errors += sum(sum(s.errors.values()) for s in samples.values())
            raw[mode] = {name: {"completed": s.completed, "errors": dict(s.errors)} for name, s in samples.items()}
            rows += summary(mode, samples)
    report["summary"], report["runs"] = rows, raw
    print(f"\n## One call at a time, call by call: A = {args.tree[0]}, B = {args.tree[1]} "
          f"({args.calls} calls each per mode, {placement.describe(report['pinning'])})\n")
    print(markdown_table(COLUMNS, rows))
    if errors:
        print(f"\n{errors} calls failed: see the JSON", file=sys.stderr)
    print(f"\nJSON: {write_json('interleave', report, args.out_dir)}")
    return 1 if errors else 0


if __name__ == "__main__":
    procs.run_script(main)
