"""At one call at a time, what the gateway adds, read from alternating blocks.

`overhead.py` runs the simulator directly for ten seconds, then the gateway for ten. On
a shared host the speed drifts within minutes (the gateway's CPU per call at c=1 moved
by a third within one session), so a tenth of a millisecond can appear or vanish
between the two runs. This alternates short closed-loop blocks against each target -
direct, gateway, gateway, direct, ... - so that drift reaches both alike, and reports
the median over rounds of each round's difference, with its spread. Same simulator,
gateway, policy (budget on), request and placement as `overhead.py`.

    .venv/bin/python bench/paired.py                 # 40 rounds of 0.4 s blocks, both modes
    .venv/bin/python bench/paired.py --rounds 10 --modes stream
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from bench import placement
from bench.gwstack import install_signal_handlers, workspace
from bench.loadgen import CLIENTS, Client, Target, closed_loop
from bench.overhead import Stack
from bench.report import add_output_options, args_config, markdown_table, run_header, write_json
from bench.stats import paired_differences, percentile

TARGETS_MS = {"non-stream": ("added p50", 0.6), "stream": ("added TTFT", 0.5)}
COLUMNS = [("mode", "mode"), ("figure", "figure"), ("rounds", "rounds"), ("median of rounds ms", "median_ms"),
           ("25th pct ms", "q25_ms"), ("75th pct ms", "q75_ms"), ("pooled p50 difference ms", "pooled_ms"),
           ("rounds within target", "share_within"), ("direct p50 ms", "direct_ms")]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="direct/gateway block pairs per mode (default 40)")
    parser.add_argument("--block", type=float, default=0.4, help="measured seconds per block (default 0.4)")
    parser.add_argument("--block-warmup", type=float, default=0.05,
                        help="unmeasured seconds at the start of each block, after the switch (default 0.05)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds on each target before the rounds")
    parser.add_argument("--modes", default="non-stream,stream", help="comma-separated: non-stream, stream")
    add_output_options(parser, pinning=True)
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or not set(args.modes) <= set(TARGETS_MS):
        parser.error("--modes: non-stream and/or stream")
    if not 2 <= args.rounds <= 10_000 or not 0 < args.block <= 60 or not 0 <= args.block_warmup <= 10:
        parser.error("--rounds within [2, 10000], --block within (0, 60], --block-warmup within [0, 10]")
    # What overhead.Stack reads: the same simulator and gateway as overhead.py's defaults.
    args.token_delay = args.latency = 0.0
    args.no_budget, args.database_url, args.redis_url, args.workers = False, None, None, 1
    return args


async def block(client: Client, target: Target, seconds: float, warmup: float) -> tuple[float, float]:
    """One closed-loop block at c=1: its p50 latency and p50 TTFT, in seconds."""
    if warmup > 0:
        await closed_loop(client, target, 1, warmup, 1_000_000)
    samples = await closed_loop(client, target, 1, seconds, 1_000_000)
    if samples.errors:
        raise RuntimeError(f"{target.name}: {samples.errors}")
    return percentile(samples.latencies_s, 50), percentile(samples.ttfts_s, 50)


async def rounds(stack: Stack, args: argparse.Namespace, stream: bool) -> list[dict[str, float]]:
    direct, gateway = stack.target("direct", stream), stack.target("gateway", stream)
    clients = {target: CLIENTS["raw"](1) for target in (direct, gateway)}
    try:
        for target, client in clients.items():
            await closed_loop(client, target, 1, args.warmup, 1_000_000)
        results = []
        for i in range(args.rounds):
            order = (direct, gateway) if i % 2 == 0 else (gateway, direct)  # neither always goes first
            figures = {t.name: await block(clients[t], t, args.block, args.block_warmup) for t in order}
            results.append({"direct_p50_s": figures["direct"][0], "gateway_p50_s": figures["gateway"][0],
                            "direct_ttft_s": figures["direct"][1], "gateway_ttft_s": figures["gateway"][1]})
        return results
    finally:
        for client in clients.values():
            await client.aclose()


def summary(mode: str, results: list[dict[str, float]]) -> list[dict[str, Any]]:
    kinds = [("added p50", "p50_s"), ("added TTFT", "ttft_s")] if mode == "stream" else [("added p50", "p50_s")]
    rows = []
    for figure, key in kinds:
        pairs = [(r[f"direct_{key}"], r[f"gateway_{key}"]) for r in results]
        diff = paired_differences(pairs)
        name, target_ms = TARGETS_MS[mode]
        within = None if figure != name else sum(g - d <= target_ms / 1000 for d, g in pairs)
        rows.append({"mode": mode, "figure": figure, "rounds": len(pairs), **{f"{k}_ms": round(v * 1000, 3) for k, v in diff.items()},
                     "share_within": None if within is None else f"{within} of {len(pairs)} (<= {target_ms} ms)",
                     "direct_ms": round(percentile([d for d, _ in pairs], 50) * 1000, 3)})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    report: dict[str, Any] = run_header("paired", args_config(args))
    with workspace("gateway-paired-") as workdir, ExitStack() as exits:
        place = placement.from_args(args)
        stack = Stack(args, workdir, exits, place)
        placement.join_load_core(place)
        report["pinning"] = placement.report(place)
        print(placement.describe(report["pinning"]), file=sys.stderr, flush=True)
        rows, raw = [], {}
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            for mode in args.modes:
                raw[mode] = runner.run(rounds(stack, args, mode == "stream"))
                rows += summary(mode, raw[mode])
    report["summary"], report["rounds"] = rows, raw
    print(f"\n## Added at c=1, alternating {args.block:g} s blocks ({args.rounds} rounds per mode, "
          f"{placement.describe(report['pinning'])})\n")
    print(markdown_table(COLUMNS, rows))
    print(f"\nJSON: {write_json('paired', report, args.out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
