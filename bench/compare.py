"""Our gateway vs other LLM proxies, side by side in one run, all in front of the same simulator.

Starts the hosted simulator once (on one core with the load generator; `--require-auth`, so
a proxy that drops the client's key gets 401s), then one proxy at a time on the other, the
gateway's core (bench/placement.py, the same for every proxy; bench/peers.py):
ours, the LiteLLM proxy, the Portkey AI gateway, vllm-router. While each proxy is up, every
mode x concurrency runs direct-to-simulator and through the proxy back to back (so each proxy
has its own direct baseline under the same noise). Prints one Markdown table with an
ours/<peer> ratio row per peer and writes bench/out/compare-<timestamp>.json.

    .venv/bin/python bench/compare.py                      # ours and litellm; 8 s runs, 2 s warm-up, c=1,16, both modes
    .venv/bin/python bench/compare.py --quick --proxies all   # all four peers; 3 s runs, 0.5 s warm-up
    .venv/bin/python bench/compare.py --from-json bench/out/compare-<timestamp>.json   # reprint a table
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from bench import peers, placement, procs
from bench.gwstack import install_signal_handlers, workspace
from bench.loadgen import CLIENTS, Target, closed_loop
from bench.overhead import (
    CHAT_PATH,
    READY_TIMEOUT_S,
    SETTLE_S,
    SIM_KEY,
    add_load_options,
    check_load_options,
)
from bench.peers import PEERS, Proxy
from bench.placement import Placement
from bench.report import args_config, markdown_table, run_header, write_json
from bench.stats import summarize
from bench.workload import MAX_TOKENS, chat_body, prompt_tokens


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_options(parser, duration=8.0, concurrency="1,16")
    parser.add_argument(
        "--proxies",
        default="ours,litellm",
        help=f"comma-separated, measured in the order given, from: {', '.join(PEERS)}; or all (default ours,litellm)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 s runs, 0.5 s warm-up")
    peers.add_options(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup = 3.0, 0.5
    check_load_options(parser, args)
    names = [p.strip() for p in args.proxies.split(",") if p.strip()]
    args.proxies = list(PEERS) if names == ["all"] else list(dict.fromkeys(names))
    if not args.proxies or not set(args.proxies) <= set(PEERS):
        parser.error(f"--proxies: all, or some of {', '.join(PEERS)}")
    return args


class Simulator:
    def __init__(self, args: argparse.Namespace, workdir: Path, exits: ExitStack, place: Placement | None) -> None:
        self.port = procs.free_port()
        argv = [
            sys.executable,
            "-m",
            "gateway",
            "sim",
            "hosted",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--token-delay",
            str(args.token_delay),
            "--latency",
            str(args.latency),
            "--require-auth",  # 401 without a bearer key: a proxy must pass the simulator's key on
        ]
        self.proc = procs.Spawned("simulator", argv, dict(os.environ), workdir, placement.load_core(place))
        exits.callback(self.proc.stop)
        procs.wait_until(self.proc, self.port, "GET", "/v1/models", READY_TIMEOUT_S)
        # Its own first answer is slow (tokenizer load): take it before any proxy is timed.
        warm = Target("direct", self.port, CHAT_PATH, SIM_KEY, False, chat_body(False))
        procs.wait_until(self.proc, self.port, "POST", CHAT_PATH, READY_TIMEOUT_S, body=warm.body, headers=warm.headers())


def _cpu(proxy: Proxy, sim: Simulator) -> dict[str, float]:
    return {
        "proxy": procs.cpu_seconds(proxy.proc.pid),
        "sim": procs.cpu_seconds(sim.proc.pid),
        "loadgen": time.process_time(),
        "core_busy": procs.cpu_busy_seconds(proxy.place.gateway_cpu) if proxy.place else math.nan,
    }


def cpu_figures(
    through_proxy: bool, completed: int, elapsed: float, start: dict[str, float], end: dict[str, float], settled: dict[str, float]
) -> dict[str, Any]:
    """As bench/overhead.py: per-request CPU up to `settled` (after the proxy's post-response
    work), utilisation over the run itself; `proxy_cpu_ms_per_req` only for proxy runs."""
    done, elapsed = max(completed, 1), elapsed or math.nan
    proxy_s = end["proxy"] - start["proxy"]
    figures: dict[str, Any] = {
        "sim_cpu_ms_per_req": round((settled["sim"] - start["sim"]) * 1000 / done, 3),
        "loadgen_cpu_ms_per_req": round((end["loadgen"] - start["loadgen"]) * 1000 / done, 3),
        "loadgen_cpu_pct": round((end["loadgen"] - start["loadgen"]) * 100 / elapsed, 1),
        "proxy_cpu_pct": round(proxy_s * 100 / elapsed, 1),
        "core_others_pct": None
        if math.isnan(start["core_busy"])
        else round(min(100.0, max(0.0, end["core_busy"] - start["core_busy"] - proxy_s) * 100 / elapsed), 1),
        "loadavg_1m": os.getloadavg()[0],
    }
    if through_proxy:
        figures["proxy_cpu_ms_per_req"] = round((settled["proxy"] - start["proxy"]) * 1000 / done, 3)
    return figures


async def measure(
    args: argparse.Namespace, proxy: Proxy, sim: Simulator, target: Target, concurrency: int, label: str
) -> dict[str, Any]:
    client = CLIENTS[args.client](concurrency)
    try:
        if args.warmup > 0:
            await closed_loop(client, target, concurrency, args.warmup, args.max_requests)
        await asyncio.sleep(SETTLE_S)
        start = _cpu(proxy, sim)
        samples = await closed_loop(client, target, concurrency, args.duration, args.max_requests)
        end = _cpu(proxy, sim)
        await asyncio.sleep(SETTLE_S)
        settled = _cpu(proxy, sim)
    finally:
        await client.aclose()
    row: dict[str, Any] = {
        "target": label,
        "phase": proxy.name,
        "mode": "stream" if target.stream else "non-stream",
        "concurrency": concurrency,
    }
    figures = cpu_figures(target.port == proxy.port, samples.completed, samples.elapsed_s, start, end, settled)
    row |= summarize(samples) | figures
    print(
        f"  {label:16s} {row['mode']:10s} c={concurrency:<3d} {row['rps']:9.1f} req/s  p50 {row['p50_ms']:8.2f} ms"
        f"  p99 {row['p99_ms']:8.2f} ms  errors {row['errors']} {row['error_kinds'] or ''}",
        file=sys.stderr,
        flush=True,
    )
    return row


async def run_phase(args: argparse.Namespace, proxy: Proxy, sim: Simulator) -> list[dict[str, Any]]:
    """Direct and this proxy back to back for each mode x concurrency."""
    rows = []
    direct_label = f"direct ({proxy.name})"
    for mode in args.modes:
        for concurrency in args.concurrency:
            stream = mode == "stream"
            direct = Target("direct", sim.port, CHAT_PATH, SIM_KEY, stream, chat_body(stream))
            rows.append(await measure(args, proxy, sim, direct, concurrency, direct_label))
            rows.append(await measure(args, proxy, sim, proxy.target(stream), concurrency, proxy.name))
    return rows


def _ratio(a: Any, b: Any, digits: int = 2) -> float | None:
    try:
        num, den = float(a), float(b)
    except (TypeError, ValueError):
        return None
    if math.isnan(num) or math.isnan(den) or den == 0:
        return None
    return round(num / den, digits)


def ratio_row(
    name: str, mode: str, conc: int, ours: dict[str, Any], peer: dict[str, Any], po: dict[str, Any], pp: dict[str, Any]
) -> dict[str, Any]:
    """ours / peer for one mode x concurrency; RSS (after load) and start-up are per proxy."""
    row: dict[str, Any] = {"target": f"**ours/{name}**", "mode": mode, "concurrency": conc}
    for key, src in (
        ("rps", "rps"),
        ("p50_ms", "p50_ms"),
        ("p99_ms", "p99_ms"),
        ("ttft_p50_ms", "ttft_p50_ms"),
        ("cpu_ms", "proxy_cpu_ms_per_req"),
    ):
        value = _ratio(ours.get(src), peer.get(src))
        row[key] = f"{value}x" if value is not None else None
    row["rss"] = f"{_ratio(po['memory_after_load']['rss_kib'], pp['memory_after_load']['rss_kib'])}x"
    row["startup"] = f"{_ratio(po['startup']['first_chat_200_s'], pp['startup']['first_chat_200_s'])}x"
    return row


def table_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per mode x concurrency: each proxy after its direct baseline, then an ours/<peer> row per peer."""
    proxies = report["proxies"]
    by_key = {(r["target"], r["mode"], r["concurrency"]): r for r in report["runs"]}
    out: list[dict[str, Any]] = []
    cfg = report["config"]
    for mode in cfg["modes"]:
        for conc in cfg["concurrency"]:
            for name in cfg["proxies"]:
                for label in (f"direct ({name})", name):
                    run = by_key.get((label, mode, conc))
                    if run is None:
                        continue
                    row = {
                        "target": label,
                        "mode": mode,
                        "concurrency": conc,
                        "rps": run["rps"],
                        "p50_ms": run["p50_ms"],
                        "p99_ms": run["p99_ms"],
                        "ttft_p50_ms": run["ttft_p50_ms"],
                        "cpu_ms": run.get("proxy_cpu_ms_per_req"),
                        "errors": run["errors"],
                        "others": run.get("core_others_pct", run.get("cpu0_others_pct")),
                    }
                    if label == name and name in proxies:
                        p = proxies[name]
                        row["rss"] = f"{p['memory_idle']['rss_kib'] / 1024:.0f} -> {p['memory_after_load']['rss_kib'] / 1024:.0f}"
                        row["startup"] = f"{p['startup']['first_chat_200_s']:.2f}"
                    out.append(row)
            ours = by_key.get(("ours", mode, conc))
            for name in cfg["proxies"]:
                peer = by_key.get((name, mode, conc))
                if name != "ours" and ours and peer and "ours" in proxies and name in proxies:
                    out.append(ratio_row(name, mode, conc, ours, peer, proxies["ours"], proxies[name]))
    return out


COLUMNS = [
    ("target", "target"),
    ("mode", "mode"),
    ("conc", "concurrency"),
    ("req/s", "rps"),
    ("p50 ms", "p50_ms"),
    ("p99 ms", "p99_ms"),
    ("TTFT p50 ms", "ttft_p50_ms"),
    ("proxy CPU ms/req", "cpu_ms"),
    ("RSS MiB idle -> after", "rss"),
    ("start-up s (first 200)", "startup"),
    ("errors", "errors"),
    ("others on the proxy's CPU %", "others"),
]


def print_report(report: dict[str, Any]) -> None:
    machine, git = report["machine"], report["git"]
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    print(
        f"\n## Ours vs {', '.join(n for n in report['config']['proxies'] if n != 'ours') or 'nothing'} ({git['commit']}, {machine['nproc']} CPUs {machine['cpu_model']},"
        f" {placement.describe(report['pinning'])}, client: {report['config']['client']}, {versions},"
        f" {report['config']['duration']} s runs)\n"
    )
    print(markdown_table(COLUMNS, table_rows(report)))
    print(
        "\nproxy CPU ms/req: the proxy's process tree (/proc utime+stime) per completed request; ratio rows are"
        " ours divided by that peer (lower is better except req/s). RSS and start-up are per proxy, not per run."
        " others on the proxy's CPU %: that core's time not used by the proxy during the run (the shared machine's noise)."
    )


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--from-json":  # reprint a saved run's table
        print_report(json.loads(Path(sys.argv[2]).read_text()))
        return 0
    args = parse_args(argv)
    install_signal_handlers()
    place = placement.from_args(args)
    report: dict[str, Any] = {
        **run_header(
            "compare",
            args_config(args) | {"prompt_tokens_o200k": prompt_tokens(), "max_tokens": MAX_TOKENS, "event_loop": "uvloop"},
        ),
        "pinning": placement.report(place),
        "versions": {},
        "proxies": {},
        "runs": [],
    }
    paths, report["versions"] = peers.install(args)
    if "litellm" in args.proxies:
        report["litellm_config"] = peers.LITELLM_CONFIG
    failed: dict[str, str] = {}
    with workspace("compare-bench-") as workdir, ExitStack() as exits:
        sim = Simulator(args, workdir, exits, place)
        placement.join_load_core(place)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            for name in args.proxies:
                with ExitStack() as phase:  # one proxy at a time: stopped before the next starts
                    try:
                        proxy = peers.start(name, args, paths, sim.port, workdir, phase, place)
                    except (RuntimeError, TimeoutError) as exc:
                        failed[name] = str(exc)
                        print(f"{name} failed to start: {exc}", file=sys.stderr, flush=True)
                        continue
                    print(
                        f"{name}: first 200 after {proxy.startup['first_chat_200_s']:.2f} s; {placement.describe(report['pinning'])}",
                        file=sys.stderr,
                        flush=True,
                    )
                    idle = proxy.memory()
                    report["runs"] += runner.run(run_phase(args, proxy, sim))
                    report["proxies"][name] = {
                        "argv": proxy.argv,
                        "extra_headers": dict(proxy.extra_headers),
                        "startup": proxy.startup,
                        "memory_idle": idle,
                        "memory_after_load": proxy.memory(),
                        "log_tail": proxy.proc.log_tail(15),
                    }
    report["failed"] = failed
    print_report(report)
    path = write_json("compare", report, args.out_dir)
    print(f"\nJSON: {path}")
    return 1 if failed or any(r["errors"] for r in report["runs"]) else 0


if __name__ == "__main__":
    procs.run_script(main)
