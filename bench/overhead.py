"""Gateway vs direct: what the gateway adds to latency, throughput and CPU.

Starts the hosted simulator and a gateway in front of it (minimal policy, one tenant
with a budget so the durable reservation is on the path), then runs closed-loop load
against each for every mode x concurrency, back to back. Prints Markdown tables and
writes bench/out/overhead-<timestamp>.json.

    .venv/bin/python bench/overhead.py            # 10 s per run, concurrency 1,16,64
    .venv/bin/python bench/overhead.py --quick    # ~40 s smoke run: 3 s runs, concurrency 1,16

`--responses` adds the same call through POST /v1/responses; `--messages` adds it
through POST /v1/messages to an Anthropic simulator upstream, next to that simulator
called directly - all in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from bench import placement, procs
from bench.gwstack import install_signal_handlers, workspace
from bench.loadgen import CLIENTS, Target, closed_loop
from bench.placement import Placement
from bench.report import (
    OVERHEAD_COLUMNS,
    RUN_COLUMNS,
    add_output_options,
    args_config,
    markdown_table,
    run_header,
    write_json,
)
from bench.stats import RunSamples, added_latency, summarize
from bench.workload import MAX_TOKENS, chat_body, messages_body, prompt_tokens, responses_body
from gateway.auth.keys import key_digest, new_api_key

READY_TIMEOUT_S = 60.0
SETTLE_S = 0.3  # lets the ledger writer finish a run's settlements before CPU is read
SIM_KEY = "sk-sim-bench"
CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"
MESSAGES_PATH = "/v1/messages"
ANTHROPIC_VERSION = (("anthropic-version", "2023-06-01"),)
ANTHROPIC_MODEL = "claude-sim"  # as the Anthropic simulator serves it
DIRECT = ("direct", "anthropic-direct")  # the targets without the gateway
# The Anthropic simulator's own rate limits, far above what a benchmark sends.
UNLIMITED = {"rpm": 10**9, "input_tpm": 10**12, "output_tpm": 10**12}
CLAUDE_POLICY = """\
  claude:
    kind: anthropic
    base_url: http://127.0.0.1:{port}
    api_key_env: BENCH_SIM_API_KEY
"""
CLAUDE_MODEL = """\
  bench-claude:
    upstream: claude
    upstream_model: claude-sim
    price: {input: 1.00, cached_input: 0.10, cache_write: 1.25, output: 5.00}
"""
POLICY = """\
version: 1
upstreams:
  local:
    kind: openai
    base_url: http://127.0.0.1:{sim_port}/v1
    api_key_env: BENCH_SIM_API_KEY    # the simulator, like OpenAI, answers 401 without a key
models:
  bench-model:
    upstream: local
    price: {{input: 0.15, cached_input: 0.075, output: 0.60}}
tenants:
  acme:
    api_keys: ["{digest}"]
    budget: {{usd: "1000000.00", period: month}}
"""
BUDGET_LINE = '    budget: {usd: "1000000.00", period: month}\n'  # a durable hold on every call


def add_load_options(parser: argparse.ArgumentParser, duration: float, concurrency: str) -> None:
    """The closed-loop run options overhead.py and compare.py share."""
    parser.add_argument("--duration", type=float, default=duration, help=f"measured seconds per run (default {duration:g})")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each run (default 2)")
    parser.add_argument("--concurrency", default=concurrency, help=f"comma-separated closed-loop concurrencies (default {concurrency})")
    parser.add_argument("--modes", default="non-stream,stream", help="comma-separated: non-stream, stream")
    parser.add_argument("--client", choices=sorted(CLIENTS), default="raw", help="load generator HTTP client (default raw)")
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="cap on requests per run")
    parser.add_argument("--token-delay", type=float, default=0.0, help="simulator seconds between streamed chunks")
    parser.add_argument("--latency", type=float, default=0.0, help="simulator seconds before the first token")
    add_output_options(parser, pinning=True)


def check_load_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Parse and check what add_load_options added (after any --quick overrides)."""
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.concurrency or min(args.concurrency) < 1 or max(args.concurrency) > 1024:
        parser.error("--concurrency: integers from 1 to 1024")
    if not set(args.modes) <= {"non-stream", "stream"} or not args.modes:
        parser.error("--modes: non-stream and/or stream")
    if not 0 < args.duration <= 600 or not 0 <= args.warmup <= 60:
        parser.error("--duration must be within (0, 600] and --warmup within [0, 60]")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_options(parser, duration=10.0, concurrency="1,16,64")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 s runs, 0.5 s warm-up, concurrency 1,16")
    parser.add_argument("--workers", type=int, default=1, help="gateway uvicorn workers (default 1)")
    parser.add_argument("--database-url", help="gateway DATABASE_URL (default: SQLite in a temporary GATEWAY_VAR_DIR)")
    parser.add_argument("--redis-url", help="gateway REDIS_URL: shared buckets and caches, as replicas run (default: in-process)")
    parser.add_argument("--no-budget", action="store_true",
                        help="tenant without a budget: no durable hold per call (shows what the hold's commit costs)")
    parser.add_argument("--responses", action="store_true",
                        help="also the same call through POST /v1/responses (translated to chat, stored), in the same run")
    parser.add_argument("--messages", action="store_true",
                        help="also the same call through POST /v1/messages to an Anthropic simulator, and to it directly")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.concurrency = 3.0, 0.5, "1,16"
    check_load_options(parser, args)
    if args.workers > 1 and not args.redis_url:
        parser.error("--workers above 1 needs --redis-url (the gateway refuses per-worker rate limits)")
    return args


class Stack:
    """The simulator and the gateway, started in order and always stopped."""

    def __init__(self, args: argparse.Namespace, workdir: Path, exits: ExitStack, place: Placement | None) -> None:
        self.args, self.workdir, self.exits, self.place = args, workdir, exits, place
        self.api_key = new_api_key()
        self.sim_port, self.gateway_port, self.claude_port = procs.free_port(), procs.free_port(), procs.free_port()
        self.sim = self._start_simulator()
        self.claude = self._start_anthropic_simulator() if args.messages else None
        self.gateway, self.startup = self._start_gateway()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], cpu: int | None) -> procs.Spawned:
        proc = procs.Spawned(name, [sys.executable, "-m", "gateway", *argv], env, self.workdir, cpu)
        self.exits.callback(proc.stop)
        return proc

    def _start_simulator(self) -> procs.Spawned:
        argv = ["sim", "hosted", "--host", "127.0.0.1", "--port", str(self.sim_port),
                "--token-delay", str(self.args.token_delay), "--latency", str(self.args.latency)]
        sim = self._spawn("simulator", argv, dict(os.environ), placement.load_core(self.place))
        procs.wait_until(sim, self.sim_port, "GET", "/v1/models", READY_TIMEOUT_S)
        # The simulator's own first answer is slow (it loads its tokenizer): take it
        # now, so the gateway's start-up figure is the gateway's alone.
        procs.wait_until(sim, self.sim_port, "POST", CHAT_PATH, READY_TIMEOUT_S, body=chat_body(False),
                         headers=self.target("direct", False).headers())
        return sim

    def _start_anthropic_simulator(self) -> procs.Spawned:
        argv = ["sim", "anthropic", "--host", "127.0.0.1", "--port", str(self.claude_port),
                "--token-delay", str(self.args.token_delay), "--latency", str(self.args.latency)]
        sim = self._spawn("anthropic-simulator", argv, dict(os.environ), placement.load_core(self.place))
        procs.wait_until(sim, self.claude_port, "GET", "/v1/models", READY_TIMEOUT_S)
        httpx.post(f"http://127.0.0.1:{self.claude_port}/sim/config", json=UNLIMITED, timeout=10).raise_for_status()
        direct = self.target("anthropic-direct", False)
        procs.wait_until(sim, self.claude_port, "POST", MESSAGES_PATH, READY_TIMEOUT_S, body=direct.body, headers=direct.headers())
        return sim

    def _start_gateway(self) -> tuple[procs.Spawned, dict[str, float]]:
        policy = self.workdir / "policy.yaml"
        text = POLICY.format(sim_port=self.sim_port, digest=key_digest(self.api_key))
        if self.claude is not None:
            text = text.replace("models:\n", CLAUDE_POLICY.format(port=self.claude_port) + "models:\n" + CLAUDE_MODEL, 1)
        policy.write_text(text.replace(BUDGET_LINE, "") if self.args.no_budget else text)
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "GATEWAY_POLICY")}
        env |= {"GATEWAY_VAR_DIR": str(self.workdir / "var"), "BENCH_SIM_API_KEY": SIM_KEY}
        if self.args.database_url:
            env["DATABASE_URL"] = self.args.database_url
        if self.args.redis_url:
            env["REDIS_URL"] = self.args.redis_url
        argv = ["serve", "--policy", str(policy), "--host", "127.0.0.1", "--port", str(self.gateway_port),
                "--workers", str(self.args.workers)]
        gateway = self._spawn("gateway", argv, env, placement.gateway_core(self.place))
        healthz_s = procs.wait_until(gateway, self.gateway_port, "GET", "/healthz", READY_TIMEOUT_S)
        first_200_s = procs.wait_until(gateway, self.gateway_port, "POST", CHAT_PATH, READY_TIMEOUT_S,
                                       body=chat_body(False), headers=self.target("gateway", False).headers())
        return gateway, {"healthz_s": round(healthz_s, 3), "first_chat_200_s": round(first_200_s, 3)}

    def target(self, name: str, stream: bool) -> Target:
        port, key = (self.sim_port, SIM_KEY) if name == "direct" else (self.gateway_port, self.api_key)
        if name in ("messages", "anthropic-direct"):
            port, key, model = (self.gateway_port, self.api_key, "bench-claude") if name == "messages" else (
                self.claude_port, SIM_KEY, ANTHROPIC_MODEL)
            return Target(name, port, MESSAGES_PATH, key, stream, messages_body(stream, model), ANTHROPIC_VERSION)
        if name == "responses":
            return Target(name, port, RESPONSES_PATH, key, stream, responses_body(stream))
        return Target(name, port, CHAT_PATH, key, stream, chat_body(stream))

    def memory(self) -> dict[str, int]:
        return {"rss_kib": procs.memory_kib(self.gateway.pid), "hwm_kib": procs.memory_kib(self.gateway.pid, "VmHWM")}

    def ledger_counts(self) -> tuple[float, float]:
        """(commits, operations) of the gateway's ledger writer, from its /metrics."""
        text = httpx.get(f"http://127.0.0.1:{self.gateway_port}/metrics", timeout=10).text
        found = {family.name: family.samples[0].value for family in text_string_to_metric_families(text)
                 if family.name in ("gateway_ledger_commits", "gateway_ledger_operations")}
        return found.get("gateway_ledger_commits", math.nan), found.get("gateway_ledger_operations", math.nan)

    def cpu(self) -> CpuTimes:
        busy = procs.cpu_busy_seconds(self.place.gateway_cpu) if self.place else math.nan
        sims = procs.cpu_seconds(self.sim.pid) + (procs.cpu_seconds(self.claude.pid) if self.claude is not None else 0.0)
        return CpuTimes(procs.cpu_seconds(self.gateway.pid), procs.cpu_seconds(self.gateway.pid, main_threads=True),
                        sims, time.process_time(), busy)


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative CPU seconds: each process tree (and the gateway's event loop threads
    alone), this process (the load generator), and all of the gateway's core (NaN
    unpinned)."""

    gateway: float
    gateway_loop: float
    sim: float  # the simulators' trees together (the one not under load idles)
    loadgen: float
    gateway_core_busy: float


def cpu_figures(target: Target, samples: RunSamples, start: CpuTimes, end: CpuTimes, settled: CpuTimes) -> dict[str, Any]:
    """Per-request CPU from start to `settled` (after the ledger writes of the run's last
    requests); utilisation percentages over the run itself (start to `end`)."""
    done, elapsed = max(samples.completed, 1), samples.elapsed_s or math.nan
    gateway_s = end.gateway - start.gateway
    figures: dict[str, Any] = {
        "sim_cpu_ms_per_req": round((settled.sim - start.sim) * 1000 / done, 3),
        "loadgen_cpu_ms_per_req": round((end.loadgen - start.loadgen) * 1000 / done, 3),
        "loadgen_cpu_pct": round((end.loadgen - start.loadgen) * 100 / elapsed, 1),
        "gateway_cpu_pct": round(gateway_s * 100 / elapsed, 1),
        # The gateway's core's time used by anything but the gateway: the shared machine's noise.
        "core_others_pct": None if math.isnan(start.gateway_core_busy) else
        round(min(100.0, max(0.0, end.gateway_core_busy - start.gateway_core_busy - gateway_s) * 100 / elapsed), 1),
        "loadavg_1m": os.getloadavg()[0],
    }
    if target.name not in DIRECT:
        figures["gateway_cpu_ms_per_req"] = round((settled.gateway - start.gateway) * 1000 / done, 3)
        loop_s = settled.gateway_loop - start.gateway_loop
        figures["gateway_loop_cpu_ms_per_req"] = round(loop_s * 1000 / done, 3)
        # The ledger writer, mostly: its commits share the gateway's core with the loop.
        figures["gateway_threads_cpu_ms_per_req"] = round((settled.gateway - start.gateway - loop_s) * 1000 / done, 3)
        figures["gateway_cpu_split"] = f"{figures['gateway_loop_cpu_ms_per_req']:.2f} / {figures['gateway_threads_cpu_ms_per_req']:.2f}"
    return figures


async def measure(stack: Stack, target: Target, concurrency: int) -> dict[str, Any]:
    args = stack.args
    client = CLIENTS[args.client](concurrency)
    try:
        if args.warmup > 0:
            await closed_loop(client, target, concurrency, args.warmup, args.max_requests)
        await asyncio.sleep(SETTLE_S)
        start, ledger_before = stack.cpu(), stack.ledger_counts()
        samples = await closed_loop(client, target, concurrency, args.duration, args.max_requests)
        end = stack.cpu()
        await asyncio.sleep(SETTLE_S)
        settled, ledger_after = stack.cpu(), stack.ledger_counts()
    finally:
        await client.aclose()
    row: dict[str, Any] = {"target": target.name, "mode": "stream" if target.stream else "non-stream", "concurrency": concurrency}
    return row | summarize(samples) | cpu_figures(target, samples, start, end, settled) | ledger_figures(
        target, samples, ledger_before, ledger_after)


def ledger_figures(target: Target, samples: RunSamples, before: tuple[float, float], after: tuple[float, float]) -> dict[str, Any]:
    """The gateway's ledger commits per second of load, and the operations (holds,
    settlements) each carried: every call commits its hold before it is sent."""
    if target.name in DIRECT:
        return {}
    commits, operations = after[0] - before[0], after[1] - before[1]
    return {"ledger_commits_per_s": round(commits / samples.elapsed_s, 1),
            "ledger_ops_per_commit": round(operations / commits, 2) if commits else math.nan}


async def run_matrix(stack: Stack) -> list[dict[str, Any]]:
    """Direct and gateway back to back for each combination, so both see the same noise."""
    rows = []
    for mode in stack.args.modes:
        for concurrency in stack.args.concurrency:
            names = ["direct", "gateway", *(["responses"] if stack.args.responses else []),
                     *(["anthropic-direct", "messages"] if stack.args.messages else [])]
            for name in names:
                row = await measure(stack, stack.target(name, mode == "stream"), concurrency)
                print(f"  {name:16s} {mode:10s} c={concurrency:<3d} {row['rps']:9.1f} req/s  p50 {row['p50_ms']:8.2f} ms"
                      f"  p99 {row['p99_ms']:8.2f} ms  errors {row['errors']}", file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def overhead_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_key = {(r["target"], r["mode"], r["concurrency"]): r for r in rows}
    result = []
    for (target, mode, concurrency), gateway in by_key.items():
        direct = by_key.get(("anthropic-direct" if target == "messages" else "direct", mode, concurrency))
        if target not in DIRECT and direct is not None:
            shown = mode if target == "gateway" else f"{mode} via /v1/{target}"
            entry = {"mode": shown, "concurrency": concurrency, **added_latency(direct, gateway)}
            result.append(entry | {key: gateway.get(key) for key in
                                   ("gateway_cpu_ms_per_req", "ledger_commits_per_s", "ledger_ops_per_commit")})
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    report: dict[str, Any] = run_header("overhead", args_config(args) | {
        "prompt_tokens_o200k": prompt_tokens(), "max_tokens": MAX_TOKENS, "event_loop": "uvloop"})
    with workspace("gateway-bench-") as workdir, ExitStack() as exits:
        place = placement.from_args(args)
        stack = Stack(args, workdir, exits, place)
        placement.join_load_core(place)
        report["pinning"] = placement.report(place)
        report["startup"] = stack.startup
        report["memory_idle"] = stack.memory()
        print(f"started in {stack.startup['first_chat_200_s']:.2f} s; {placement.describe(report['pinning'])}; client: {args.client}",
              file=sys.stderr, flush=True)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            rows = runner.run(run_matrix(stack))
        report["memory_after_load"] = stack.memory()
        report["runs"] = rows
        report["overhead"] = overhead_rows(rows)
    print_report(report)
    path = write_json("overhead", report, args.out_dir)
    print(f"\nJSON: {path}")
    return 1 if any(r["errors"] for r in rows) else 0


def print_report(report: dict[str, Any]) -> None:
    machine, git = report["machine"], report["git"]
    print(f"\n## Gateway overhead vs direct ({git['commit']}, {machine['nproc']} CPUs {machine['cpu_model']},"
          f" {placement.describe(report['pinning'])}, client: {report['config']['client']})\n")
    print(markdown_table(RUN_COLUMNS, report["runs"]))
    print("\n### Added by the gateway (gateway minus direct, same mode and concurrency)\n")
    print(markdown_table(OVERHEAD_COLUMNS, report["overhead"]))
    idle, after = report["memory_idle"], report["memory_after_load"]
    print(f"\nGateway start-up: /healthz after {report['startup']['healthz_s']:.2f} s, first chat 200 after"
          f" {report['startup']['first_chat_200_s']:.2f} s. RSS idle {idle['rss_kib'] / 1024:.1f} MiB, after load"
          f" {after['rss_kib'] / 1024:.1f} MiB (peak {after['hwm_kib'] / 1024:.1f} MiB).")


if __name__ == "__main__":
    procs.run_script(main)
