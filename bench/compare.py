"""Our gateway vs the LiteLLM proxy, side by side in one run, both in front of the same simulator.

Starts the hosted simulator once (CPU 1, with the load generator), then one proxy at a
time on CPU 0: our gateway (bench/overhead.py's policy: one tenant with a budget, so the
durable reservation is on the path), then the LiteLLM proxy (pinned release from
bench/litellm_venv.py, `--num_workers 1`, no database, no master key, offline cost map).
While each proxy is up, every mode x concurrency runs direct-to-simulator and through the
proxy back to back (so each proxy has its own direct baseline under the same noise).
Prints one Markdown table with ours/litellm ratios and writes bench/out/compare-<timestamp>.json.

    .venv/bin/python bench/compare.py            # 8 s runs, 2 s warm-up, concurrency 1,16, both modes
    .venv/bin/python bench/compare.py --quick    # 3 s runs, 0.5 s warm-up
    .venv/bin/python bench/compare.py --from-json bench/out/compare-<timestamp>.json   # reprint a table
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from bench import litellm_venv, procs
from bench.gwstack import workspace
from bench.loadgen import CLIENTS, Target, closed_loop
from bench.overhead import (
    CHAT_PATH,
    GATEWAY_CPU,
    LOAD_CPU,
    POLICY,
    READY_TIMEOUT_S,
    SETTLE_S,
    SIM_KEY,
    _raise_interrupt,
    add_load_options,
    check_load_options,
)
from bench.report import args_config, markdown_table, run_header, write_json
from bench.stats import summarize
from bench.workload import MAX_TOKENS, chat_body, prompt_tokens
from gateway.auth.keys import key_digest, new_api_key

PROXY_CPU = GATEWAY_CPU
LITELLM_READY_TIMEOUT_S = 180.0  # first import of litellm[proxy] is slow
LITELLM_CONFIG = """\
model_list:
  - model_name: bench-model
    litellm_params:
      model: openai/bench-model
      api_base: http://127.0.0.1:{sim_port}/v1
      api_key: {sim_key}
litellm_settings:
  telemetry: false
  drop_params: true
  set_verbose: false
  json_logs: false
general_settings:
  disable_spend_logs: true
  disable_reset_budget: true
"""
PROXIES = ("ours", "litellm")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_options(parser, duration=8.0, concurrency="1,16")
    parser.add_argument("--proxies", default="ours,litellm", help="comma-separated: ours, litellm (in this order)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 s runs, 0.5 s warm-up")
    parser.add_argument(
        "--litellm-master-key",
        action="store_true",
        help="run LiteLLM with a random master key (auth on the path, like ours) instead of none",
    )
    parser.add_argument("--litellm-venv", type=Path, default=litellm_venv.VENV_DIR, help="venv for the LiteLLM proxy")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup = 3.0, 0.5
    check_load_options(parser, args)
    args.proxies = [p.strip() for p in args.proxies.split(",") if p.strip()]
    if not set(args.proxies) <= set(PROXIES) or not args.proxies:
        parser.error("--proxies: ours and/or litellm")
    return args


class Simulator:
    def __init__(self, args: argparse.Namespace, workdir: Path, exits: ExitStack, pinned: bool) -> None:
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
        ]
        self.proc = procs.Spawned("simulator", argv, dict(os.environ), workdir, LOAD_CPU if pinned else None)
        exits.callback(self.proc.stop)
        procs.wait_until(self.proc, self.port, "GET", "/v1/models", READY_TIMEOUT_S)
        # Its own first answer is slow (tokenizer load): take it before any proxy is timed.
        warm = Target("direct", self.port, CHAT_PATH, SIM_KEY, False, chat_body(False))
        procs.wait_until(self.proc, self.port, "POST", CHAT_PATH, READY_TIMEOUT_S, body=warm.body, headers=warm.headers())


class Proxy:
    """One proxy under test on CPU 0; `stop()` ends it (also registered on the ExitStack)."""

    name: str
    api_key: str
    ready_path: str

    def __init__(self, workdir: Path, exits: ExitStack, pinned: bool) -> None:
        self.workdir, self.pinned = workdir, pinned
        self.port = procs.free_port()
        argv, env = self.command()
        self.proc = procs.Spawned(self.name, argv, env, workdir, PROXY_CPU if pinned else None)
        exits.callback(self.proc.stop)
        timeout = LITELLM_READY_TIMEOUT_S if self.name == "litellm" else READY_TIMEOUT_S
        ready_s = procs.wait_until(self.proc, self.port, "GET", self.ready_path, timeout)
        first_s = procs.wait_until(
            self.proc, self.port, "POST", CHAT_PATH, timeout, body=chat_body(False), headers=self.target(False).headers()
        )
        self.startup = {"ready_path": self.ready_path, "ready_s": round(ready_s, 3), "first_chat_200_s": round(first_s, 3)}

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def target(self, stream: bool) -> Target:
        return Target(self.name, self.port, CHAT_PATH, self.api_key, stream, chat_body(stream))

    def memory(self) -> dict[str, int]:
        return {"rss_kib": procs.memory_kib(self.proc.pid), "hwm_kib": procs.memory_kib(self.proc.pid, "VmHWM")}

    def stop(self) -> None:
        self.proc.stop()


class OurGateway(Proxy):
    name, ready_path = "ours", "/healthz"

    def __init__(self, sim_port: int, *rest: Any) -> None:
        self.sim_port, self.api_key = sim_port, new_api_key()
        super().__init__(*rest)

    def command(self) -> tuple[list[str], dict[str, str]]:
        policy = self.workdir / "policy.yaml"
        policy.write_text(POLICY.format(sim_port=self.sim_port, digest=key_digest(self.api_key)))
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "GATEWAY_POLICY")}
        env |= {"GATEWAY_VAR_DIR": str(self.workdir / "var"), "BENCH_SIM_API_KEY": SIM_KEY}
        argv = [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--policy",
            str(policy),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        return argv, env


class LiteLLM(Proxy):
    name, ready_path = "litellm", "/health/liveliness"

    def __init__(self, sim_port: int, litellm_bin: Path, master_key: bool, *rest: Any) -> None:
        self.sim_port, self.litellm_bin, self.master_key = sim_port, litellm_bin, master_key
        # Without a master key the proxy checks no key at all; with one, only that key is accepted.
        self.api_key = "sk-" + secrets.token_hex(32) if master_key else "sk-anything"
        super().__init__(*rest)

    def command(self) -> tuple[list[str], dict[str, str]]:
        config = self.workdir / "litellm.yaml"
        config.write_text(LITELLM_CONFIG.format(sim_port=self.sim_port, sim_key=SIM_KEY))
        env = litellm_venv.runtime_env()
        env.pop("VIRTUAL_ENV", None)
        if self.master_key:
            env["LITELLM_MASTER_KEY"] = self.api_key
        else:
            # 1.108.x refuses to boot without a master key (UnsafeMasterKeyError); this is its
            # documented local-development override. Everything listens on 127.0.0.1 only.
            env["LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY"] = "true"
        env["PATH"] = f"{self.litellm_bin.parent}:{env.get('PATH', '')}"
        argv = [
            str(self.litellm_bin),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--num_workers",
            "1",
        ]
        return argv, env


def _cpu(proxy: Proxy, sim: Simulator) -> dict[str, float]:
    return {
        "proxy": procs.cpu_seconds(proxy.proc.pid),
        "sim": procs.cpu_seconds(sim.proc.pid),
        "loadgen": time.process_time(),
        "cpu0_busy": procs.cpu_busy_seconds(PROXY_CPU) if proxy.pinned else math.nan,
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
        "cpu0_others_pct": None
        if math.isnan(start["cpu0_busy"])
        else round(min(100.0, max(0.0, end["cpu0_busy"] - start["cpu0_busy"] - proxy_s) * 100 / elapsed), 1),
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


def table_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per mode x concurrency: each direct baseline, each proxy, then an ours/litellm row."""
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
                        "others": run.get("cpu0_others_pct"),
                    }
                    if label == name and name in proxies:
                        p = proxies[name]
                        row["rss"] = f"{p['memory_idle']['rss_kib'] / 1024:.0f} -> {p['memory_after_load']['rss_kib'] / 1024:.0f}"
                        row["startup"] = f"{p['startup']['first_chat_200_s']:.2f}"
                    out.append(row)
            ours, lite = by_key.get(("ours", mode, conc)), by_key.get(("litellm", mode, conc))
            if ours and lite:
                ratio = {"target": "**ours/litellm**", "mode": mode, "concurrency": conc}
                for key, src in (
                    ("rps", "rps"),
                    ("p50_ms", "p50_ms"),
                    ("p99_ms", "p99_ms"),
                    ("ttft_p50_ms", "ttft_p50_ms"),
                    ("cpu_ms", "proxy_cpu_ms_per_req"),
                ):
                    value = _ratio(ours.get(src), lite.get(src))
                    ratio[key] = f"{value}x" if value is not None else None
                po, pl = proxies["ours"], proxies["litellm"]
                ratio["rss"] = f"{_ratio(po['memory_after_load']['rss_kib'], pl['memory_after_load']['rss_kib'])}x"
                ratio["startup"] = f"{_ratio(po['startup']['first_chat_200_s'], pl['startup']['first_chat_200_s'])}x"
                out.append(ratio)
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
    ("others on CPU 0 %", "others"),
]


def print_report(report: dict[str, Any]) -> None:
    machine, git = report["machine"], report["git"]
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    print(
        f"\n## Ours vs LiteLLM proxy ({git['commit']}, {machine['nproc']} CPUs {machine['cpu_model']},"
        f" pinned: {report['pinning']['used']}, client: {report['config']['client']}, {versions},"
        f" {report['config']['duration']} s runs)\n"
    )
    print(markdown_table(COLUMNS, table_rows(report)))
    print(
        "\nproxy CPU ms/req: the proxy's process tree (/proc utime+stime) per completed request; ratio rows are"
        " ours divided by litellm (lower is better except req/s). RSS and start-up are per proxy, not per run."
        " others on CPU 0 %: CPU 0 time not used by the proxy during the run (the shared machine's noise)."
    )


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--from-json":  # reprint a saved run's table
        print_report(json.loads(Path(sys.argv[2]).read_text()))
        return 0
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    pinned = not args.no_pin and procs.can_pin()
    report: dict[str, Any] = {
        **run_header("compare", args_config(args) | {
            "prompt_tokens_o200k": prompt_tokens(), "max_tokens": MAX_TOKENS, "event_loop": "uvloop"}),
        "pinning": {
            "used": pinned,
            "proxy_cpu": PROXY_CPU if pinned else None,
            "simulator_and_loadgen_cpu": LOAD_CPU if pinned else None,
        },
        "versions": {},
        "proxies": {},
        "runs": [],
    }
    litellm_bin = None
    if "litellm" in args.proxies:
        litellm_bin = litellm_venv.ensure(venv_dir=args.litellm_venv)
        report["versions"]["litellm"] = litellm_venv.installed_version(args.litellm_venv)
        report["litellm_config"] = LITELLM_CONFIG
    failed: dict[str, str] = {}
    with workspace("compare-bench-") as workdir, ExitStack() as exits:
        sim = Simulator(args, workdir, exits, pinned)
        if pinned:
            os.sched_setaffinity(0, {LOAD_CPU})
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            for name in args.proxies:
                with ExitStack() as phase:  # one proxy at a time: stopped before the next starts
                    try:
                        proxy: Proxy
                        if name == "ours":
                            proxy = OurGateway(sim.port, workdir, phase, pinned)
                        else:
                            assert litellm_bin is not None
                            proxy = LiteLLM(sim.port, litellm_bin, args.litellm_master_key, workdir, phase, pinned)
                    except (RuntimeError, TimeoutError) as exc:
                        failed[name] = str(exc)
                        print(f"{name} failed to start: {exc}", file=sys.stderr, flush=True)
                        continue
                    print(
                        f"{name}: first 200 after {proxy.startup['first_chat_200_s']:.2f} s; pinned: {pinned}",
                        file=sys.stderr,
                        flush=True,
                    )
                    idle = proxy.memory()
                    report["runs"] += runner.run(run_phase(args, proxy, sim))
                    report["proxies"][name] = {
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
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; subprocesses stopped", file=sys.stderr)
        sys.exit(130)
