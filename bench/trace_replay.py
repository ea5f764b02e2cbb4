"""Replay a production LLM trace (Azure LLM inference, conversation service, 2023)
open-loop through the gateway, in two provider-trouble scenarios, at several speeds.

Each trace row gives an arrival time and prompt/output token counts. A window of the
trace is replayed at `speed` x: each request is sent at its scheduled time whether or
not earlier ones have finished (a bounded number in flight; beyond it a request is
dropped and counted). Prompts are synthesized to about the row's ContextTokens
(texts cached per length bucket); GeneratedTokens becomes `max_tokens` with
`ignore_eos: true`, so the simulator generates exactly that many tokens.

Scenarios (a fresh simulator and gateway for each run):

- overload: the simulator enforces RPM/TPM limits below the window's peak rate at 1x
  (the same limits at every speed), and the tenant has limits in the gateway (0.9x the
  simulator's by default), with a bounded queue (max_queue, max_wait_s) in front of
  them; both buckets are drained before the replay (steady state, not a fresh minute).
- storm: the simulator answers 30 % of requests with a 429 (retry-after 50 ms) and the
  gateway retries (max_attempts 5).
- baseline (only with --scenarios): neither, for reference.

    .venv/bin/python bench/trace_replay.py            # 2 trace minutes at 1x and 4x, both scenarios (~6 min)
    .venv/bin/python bench/trace_replay.py --quick    # ~1 min smoke run: 15 trace seconds
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import math
import random
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
import uvloop

from bench import placement, procs
from bench.gwstack import (
    CHAT_PATH,
    MODEL,
    ConnectionPool,
    Stack,
    base_policy,
    install_signal_handlers,
    workspace,
)
from bench.loadgen import StreamCheck
from bench.placement import Placement
from bench.report import add_output_options, args_config, markdown_table, run_header, write_json
from bench.stats import percentile
from bench.workload import WORDS
from gateway.tokens.counting import count_chat_tokens

DEFAULT_TRACE = Path("/work/shared/traces/azure_llm_2023_conv.csv")
SCENARIOS = ("baseline", "overload", "storm")
CHAT_FRAMING_TOKENS = 6  # count_chat_tokens: 3 per message + 3 reply priming, one user message
MAX_ERROR_BODY = 4096
START_LEAD_S = 0.25  # the first request is sent this long after the replay starts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help=f"trace CSV (default {DEFAULT_TRACE})")
    parser.add_argument("--speeds", default="1,4", help="comma-separated replay speeds (default 1,4)")
    parser.add_argument("--minutes", type=float, default=2.0, help="trace minutes to replay (default 2); wall time is minutes / speed")
    parser.add_argument("--start-minute", type=float, default=0.0, help="where the window starts in the trace (default 0)")
    parser.add_argument("--scenarios", default="overload,storm",
                        help="comma-separated: overload, storm, baseline (no limits, no faults: for reference; default overload,storm)")
    parser.add_argument("--max-in-flight", type=int, default=512, help="client in-flight bound; beyond it requests are dropped (default 512)")
    parser.add_argument("--context-cap", type=int, default=8192, help="cap on prompt tokens (default 8192)")
    parser.add_argument("--output-cap", type=int, default=1024, help="cap on max_tokens (default 1024)")
    parser.add_argument("--bucket-tokens", type=int, default=32, help="prompt length bucket for cached texts (default 32)")
    parser.add_argument("--no-stream", dest="stream", action="store_false", help="non-streaming requests (default: stream)")
    parser.add_argument("--token-delay", type=float, default=0.001, help="simulator seconds between streamed tokens (default 0.001)")
    parser.add_argument("--latency", type=float, default=0.1, help="simulator seconds before the first token (default 0.1)")
    parser.add_argument("--overload-ratio", type=float, default=0.5,
                        help="overload: simulator and tenant RPM/TPM = this x the window's peak 60-s rate at 1x (default 0.5)")
    parser.add_argument("--rpm", type=int, help="overload: RPM limit (overrides --overload-ratio)")
    parser.add_argument("--tpm", type=int, help="overload: TPM limit (overrides --overload-ratio)")
    parser.add_argument("--tenant-share", type=float, default=0.9,
                        help="overload: tenant RPM/TPM in the gateway = this x the simulator's (default 0.9: 10%% headroom)")
    parser.add_argument("--drain", type=float, default=0.98,
                        help="overload: before the replay, use up this share of the tenant's rate buckets (default 0.98; 0 = start full)")
    parser.add_argument("--max-queue", type=int, default=128, help="overload: tenant max_queue (default 128)")
    parser.add_argument("--max-wait", type=float, default=5.0, help="overload: tenant max_wait_s (default 5)")
    parser.add_argument("--fail-429-rate", type=float, default=0.3, help="storm: simulator 429 rate (default 0.3)")
    parser.add_argument("--retry-after", type=float, default=0.05, help="storm: simulator retry-after seconds (default 0.05)")
    parser.add_argument("--max-attempts", type=int, default=5, help="storm: gateway retry max_attempts (default 5)")
    parser.add_argument("--budget-ratio", type=float, default=0.5,
                        help="storm: gateway retry budget_ratio (default 0.5; a 30%% 429 rate needs ~0.43 retries per request)")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="gateway request_timeout_s (default 60)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 0.25 trace minutes")
    parser.add_argument("--seed", type=int, default=11, help="prompt text seed (default 11)")
    add_output_options(parser, pinning=True)
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes = min(args.minutes, 0.25)
    args.speeds = [float(s) for s in args.speeds.split(",") if s.strip()]
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if not args.speeds or min(args.speeds) <= 0 or max(args.speeds) > 64:
        parser.error("--speeds: numbers in (0, 64]")
    if not args.scenarios or not set(args.scenarios) <= set(SCENARIOS):
        parser.error(f"--scenarios: some of {', '.join(SCENARIOS)}")
    if not 0 < args.minutes <= 30 or args.start_minute < 0:
        parser.error("--minutes: (0, 30]; --start-minute >= 0")
    if not 1 <= args.max_in_flight <= 4096:
        parser.error("--max-in-flight: 1 to 4096")
    if not 1 <= args.max_attempts <= 10 or not 0 <= args.budget_ratio <= 10:
        parser.error("--max-attempts: 1 to 10; --budget-ratio: 0 to 10 (the policy's bounds)")
    if not 0 < args.request_timeout <= 600:
        parser.error("--request-timeout: (0, 600]")
    if not 0 <= args.drain <= 1 or not 0 < args.tenant_share <= 1:
        parser.error("--drain: within [0, 1]; --tenant-share: within (0, 1]")
    if not args.trace.is_file():
        parser.error(f"--trace: {args.trace} is not a file")
    return args


# -- the trace ------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    index: int
    t_s: float  # seconds from the start of the window, trace time
    context: int  # prompt tokens asked for (capped)
    generated: int  # max_tokens (capped)
    raw_context: int
    raw_generated: int


def _seconds(stamp: str) -> float:
    """`2023-11-16 18:15:46.6805900` -> seconds (7 fractional digits; fromisoformat takes 6)."""
    day, clock = stamp.strip().split(" ")
    hours, minutes, seconds = clock.split(":")
    return date.fromisoformat(day).toordinal() * 86_400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def load_window(path: Path, start_minute: float, minutes: float, context_cap: int, output_cap: int) -> tuple[list[Row], dict[str, Any]]:
    with path.open(newline="") as handle:
        raw = [(_seconds(r["TIMESTAMP"]), int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(handle)]
    if not raw:
        raise ValueError(f"{path}: no rows")
    first = raw[0][0]
    lo, hi = start_minute * 60, (start_minute + minutes) * 60
    rows: list[Row] = []
    for t, ctx, gen in raw:
        rel = t - first
        if lo <= rel < hi:
            rows.append(Row(len(rows), rel - lo, max(1, min(ctx, context_cap)), max(1, min(gen, output_cap)), ctx, gen))
    info = {"path": str(path), "rows_in_trace": len(raw), "trace_span_s": round(raw[-1][0] - first, 1),
            "window_s": [lo, hi], "rows_in_window": len(rows),
            "context_capped": sum(1 for r in rows if r.raw_context > context_cap),
            "output_capped": sum(1 for r in rows if r.raw_generated > output_cap)}
    return rows, info


def peak_rates(rows: list[Row], window_s: float) -> dict[str, float]:
    """Highest requests and tokens (prompt + max_tokens, what both rate limiters take)
    in any 60 s of the window at 1x; a window shorter than 60 s is scaled up to a minute."""
    if not rows:
        return {"rpm": 0.0, "tpm": 0.0}
    if window_s < 60:
        scale = 60 / window_s
        return {"rpm": len(rows) * scale, "tpm": sum(r.context + r.generated for r in rows) * scale}
    best_r = best_t = 0
    j = 0
    tokens = 0
    for i, row in enumerate(rows):  # two pointers over [t_i, t_i + 60)
        while j < len(rows) and rows[j].t_s < row.t_s + 60:
            tokens += rows[j].context + rows[j].generated
            j += 1
        best_r, best_t = max(best_r, j - i), max(best_t, tokens)
        tokens -= row.context + row.generated
    return {"rpm": float(best_r), "tpm": float(best_t)}


class PromptBank:
    """Prompt texts by length bucket: one seeded word sequence (each word one o200k
    token), sliced once per bucket, so building a request costs a dict lookup."""

    def __init__(self, max_tokens: int, bucket: int, seed: int) -> None:
        rng = random.Random(seed)
        self._words = [rng.choice(WORDS) for _ in range(max_tokens + bucket)]
        self.bucket = bucket
        self._texts: dict[int, str] = {}
        self.measured: dict[int, int] = {}  # bucket target -> count_chat_tokens of its message

    def target(self, tokens: int) -> int:
        return max(self.bucket, round(tokens / self.bucket) * self.bucket)

    def text(self, tokens: int) -> str:
        target = self.target(tokens)
        text = self._texts.get(target)
        if text is None:
            text = self._texts[target] = " ".join(self._words[:max(1, target - CHAT_FRAMING_TOKENS)])
        return text

    def measure(self) -> None:
        for target, text in self._texts.items():
            self.measured[target] = count_chat_tokens([{"role": "user", "content": text}])


def request_body(bank: PromptBank, row: Row, stream: bool) -> bytes:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": bank.text(row.context)}],
                            "max_tokens": row.generated, "ignore_eos": True}
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


# -- one run --------------------------------------------------------------------------


@dataclass
class Outcome:
    index: int
    status: int | None = None
    error: str | None = None
    latency_s: float = math.nan
    ttft_s: float = math.nan
    rejected_by: str | None = None  # 429s: "gateway" (admission) or "upstream" (the provider's, passed on)
    retry_after: str | None = None


@dataclass
class RunData:
    outcomes: list[Outcome] = field(default_factory=list)
    dropped: int = 0
    dispatch_lag_s: list[float] = field(default_factory=list)
    max_in_flight_seen: int = 0
    elapsed_s: float = 0.0
    replay_s: float = 0.0
    unfinished: int = 0
    connections_opened: int = 0


def _rejected_by(body: bytes) -> str:
    try:
        message = str(orjson.loads(body)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "unknown"
    return "upstream" if "upstream" in message else "gateway"


async def one_request(pool: ConnectionPool, headers: dict[str, str], body: bytes, row: Row, stream: bool,
                      timeout_s: float) -> Outcome:
    outcome = Outcome(row.index)
    check = StreamCheck()
    kept = bytearray()

    def on_chunk(chunk: bytes) -> None:
        if stream:
            check.feed(chunk)
        if len(kept) < MAX_ERROR_BODY:
            kept.extend(chunk[: MAX_ERROR_BODY - len(kept)])

    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            status, reply_headers = await pool.post(CHAT_PATH, body, headers, on_chunk)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        outcome.error = type(exc).__name__
        return outcome
    end = time.perf_counter()
    outcome.status = status
    if status == 429:
        outcome.error = "http_429"
        outcome.rejected_by = _rejected_by(bytes(kept))
        outcome.retry_after = reply_headers.get("retry-after-ms") or reply_headers.get("retry-after")
    elif status != 200:
        outcome.error = f"http_{status}"
    elif stream and not (check.done and check.first_content_at is not None):  # cut, or an error event instead of [DONE]
        outcome.error = "stream_incomplete"
    else:
        outcome.latency_s = end - start
        if stream and check.first_content_at is not None:
            outcome.ttft_s = check.first_content_at - start
    return outcome


def finished(task: asyncio.Task[Outcome], pending: set[asyncio.Task[Outcome]], data: RunData) -> None:
    pending.discard(task)
    if not task.cancelled():
        data.outcomes.append(task.result())


async def replay(port: int, headers: dict[str, str], rows: list[Row], bank: PromptBank, args: argparse.Namespace,
                 speed: float) -> RunData:
    """Open loop: send each row at start + t / speed, unless `max_in_flight` are pending."""
    loop = asyncio.get_running_loop()
    pool = ConnectionPool(port)
    data = RunData()
    pending: set[asyncio.Task[Outcome]] = set()
    client_timeout = args.request_timeout + 15
    begin = loop.time()
    start = begin + START_LEAD_S
    try:
        for row in rows:
            due = start + row.t_s / speed
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            data.dispatch_lag_s.append(max(0.0, loop.time() - due))
            if len(pending) >= args.max_in_flight:
                data.dropped += 1
                continue
            task = asyncio.create_task(one_request(pool, headers, request_body(bank, row, args.stream), row, args.stream,
                                                   client_timeout))
            pending.add(task)
            task.add_done_callback(lambda t: finished(t, pending, data))
            data.max_in_flight_seen = max(data.max_in_flight_seen, len(pending))
        data.replay_s = loop.time() - start
        if pending:  # every request has its own timeout; this bound is a backstop
            await asyncio.wait(set(pending), timeout=client_timeout + 5)
    finally:
        data.unfinished = len(pending)
        for task in list(pending):
            task.cancel()
        if pending:
            await asyncio.wait(set(pending), timeout=5)
        data.elapsed_s = loop.time() - begin
        data.connections_opened = pool.opened
        pool.close()
    return data


async def prime(port: int, headers: dict[str, str], scenario: str, limits: dict[str, int], args: argparse.Namespace) -> dict[str, Any]:
    """Before the replay: warm both processes up (the simulator loads its tokenizer on
    its first request, ~0.5 s), and in the overload scenario drain the rate buckets.

    Both rate limiters (simulator and gateway) start with full buckets, i.e. one whole
    minute of burst, which a 2-minute window at 1x (30 s at 4x) would mostly spend on
    the initial burst instead of on the limit. `--drain` fills that minute first with
    cheap non-streamed requests (max_tokens 1, ignore_eos, prompts sized so that
    `drain x rpm` requests take `drain x tpm` tokens), so the replay meets the limits
    in their steady state. Prompt and output counts match on both sides (same
    tokenizer; exactly max_tokens generated), so the gateway refunds nothing and its
    buckets stay in step with the simulator's."""
    pool = ConnectionPool(port)
    if scenario == "overload" and args.drain > 0:
        count = max(1, round(limits["tenant_rpm"] * args.drain))
        prompt = max(8, min(32_000, round(limits["tenant_tpm"] * args.drain / count) - 1))
    else:
        count, prompt = 8, 16
    rng = random.Random(f"prime-{args.seed}")
    text = " ".join(rng.choice(WORDS) for _ in range(max(1, prompt - CHAT_FRAMING_TOKENS)))
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1, "ignore_eos": True})
    statuses: dict[str, int] = {}
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with sem:
            try:
                async with asyncio.timeout(30):
                    status, _ = await pool.post(CHAT_PATH, body, headers, lambda chunk: None)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                status = type(exc).__name__  # type: ignore[assignment]
            statuses[str(status)] = statuses.get(str(status), 0) + 1

    begin = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        pool.close()
    tokens = count_chat_tokens([{"role": "user", "content": text}]) + 1
    return {"requests": count, "tokens_each": tokens, "tokens": tokens * count, "statuses": statuses,
            "seconds": round(time.perf_counter() - begin, 2), "drained": scenario == "overload" and args.drain > 0}


def scenario_setup(scenario: str, args: argparse.Namespace, limits: dict[str, int]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """(simulator flags, tenant additions, policy defaults) for a scenario."""
    sim = ["--token-delay", str(args.token_delay), "--latency", str(args.latency)]
    defaults: dict[str, Any] = {"request_timeout_s": args.request_timeout}
    tenant: dict[str, Any] = {}
    if scenario == "overload":
        sim += ["--rpm", str(limits["rpm"]), "--tpm", str(limits["tpm"])]
        tenant["limits"] = {"rpm": limits["tenant_rpm"], "tpm": limits["tenant_tpm"], "max_queue": args.max_queue,
                            "max_wait_s": args.max_wait}
    elif scenario == "storm":
        sim += ["--fail-429-rate", str(args.fail_429_rate), "--retry-after", str(args.retry_after)]
        defaults["retry"] = {"max_attempts": args.max_attempts, "budget_ratio": args.budget_ratio}
    return sim, tenant, defaults


def run_one(workdir: Path, place: Placement | None, scenario: str, speed: float, rows: list[Row], bank: PromptBank,
            args: argparse.Namespace, limits: dict[str, int], tag: str) -> dict[str, Any]:
    sim_flags, tenant_extra, defaults = scenario_setup(scenario, args, limits)
    with ExitStack() as exits:
        stack = Stack(workdir, exits, place, tag)
        stack.start_simulator(sim_flags)
        policy = base_policy(stack.sim_port, stack.digest)
        policy["defaults"] = defaults
        policy["tenants"]["acme"].update(tenant_extra)
        stack.start_gateway(policy)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            primed = runner.run(prime(stack.gateway_port, stack.client_headers(), scenario, limits, args))
            sim_before = stack.sim_stats()
            cpu_start, wall_start, own_start = stack.cpu_seconds(), time.perf_counter(), time.process_time()
            data = runner.run(replay(stack.gateway_port, stack.client_headers(), rows, bank, args, speed))
            cpu_end, wall, own = stack.cpu_seconds(), time.perf_counter() - wall_start, time.process_time() - own_start
        sim_after = stack.sim_stats()
        sim = {"requests": sim_after["requests"] - sim_before["requests"],
               "by_status": {k: v - sim_before["by_status"].get(k, 0) for k, v in sim_after["by_status"].items()},
               "aborted": sim_after["aborted"] - sim_before["aborted"],
               "injected_faults": sim_after["injected_faults"] - sim_before["injected_faults"],
               "active_streams": sim_after["active_streams"]}
        shown_policy = {**policy, "tenants": {"acme": {**policy["tenants"]["acme"], "api_keys": ["<digest>"]}}}
    row = summarize(scenario, speed, rows, data, sim)
    row |= {
        "gw_cpu_pct": round((cpu_end["gateway"] - cpu_start["gateway"]) * 100 / wall, 1),
        "sim_cpu_pct": round((cpu_end["simulator"] - cpu_start["simulator"]) * 100 / wall, 1),
        "loadgen_cpu_pct": round(own * 100 / wall, 1),
        "sim_flags": sim_flags,
        "policy": shown_policy,
        "sim_stats": sim,
        "prime": primed,
    }
    return row


def summarize(scenario: str, speed: float, rows: list[Row], data: RunData, sim: dict[str, Any]) -> dict[str, Any]:
    outcomes = data.outcomes
    ok = [o for o in outcomes if o.error is None]
    lat = [o.latency_s for o in ok]
    ttft = [o.ttft_s for o in ok if not math.isnan(o.ttft_s)]
    offered = len(rows)
    kinds: dict[str, int] = {}
    for o in outcomes:
        if o.error is not None:
            kinds[o.error] = kinds.get(o.error, 0) + 1
    by_source: dict[str, int] = {}
    for o in outcomes:
        if o.status == 429:
            by_source[o.rejected_by or "unknown"] = by_source.get(o.rejected_by or "unknown", 0) + 1
    attempts = int(sim.get("requests") or 0)
    forwarded = offered - data.dropped - by_source.get("gateway", 0)
    lag = data.dispatch_lag_s

    def ms(values: list[float], q: float) -> float:
        return round(percentile(values, q) * 1000, 1) if values else math.nan

    return {
        "scenario": scenario,
        "speed": speed,
        "offered": offered,
        "sent": offered - data.dropped,
        "dropped": data.dropped,
        "ok": len(ok),
        "success_pct": round(len(ok) * 100 / offered, 1) if offered else math.nan,
        "p50_ms": ms(lat, 50),
        "p99_ms": ms(lat, 99),
        "ttft_p50_ms": ms(ttft, 50),
        "ttft_p99_ms": ms(ttft, 99),
        "client_429": sum(by_source.values()),
        "client_429_gateway": by_source.get("gateway", 0),
        "client_429_upstream": by_source.get("upstream", 0),
        "other_errors": sum(v for k, v in kinds.items() if k != "http_429"),
        "error_kinds": dict(sorted(kinds.items())),
        "upstream_attempts": attempts,
        "upstream_by_status": sim.get("by_status"),
        "upstream_429": int((sim.get("by_status") or {}).get("429", 0)),
        "retries_per_request": round(attempts / offered - 1, 3) if offered else math.nan,
        "attempts_per_forwarded": round(attempts / forwarded, 3) if forwarded > 0 else math.nan,
        "max_in_flight": data.max_in_flight_seen,
        "unfinished": data.unfinished,
        "replay_s": round(data.replay_s, 2),
        "elapsed_s": round(data.elapsed_s, 2),
        "dispatch_lag_p99_ms": ms(lag, 99),
        "dispatch_lag_max_ms": round(max(lag) * 1000, 1) if lag else math.nan,
        "retry_after_ms_seen": sorted({o.retry_after for o in outcomes if o.retry_after}, key=lambda v: float(v))[:10],
        "connections_opened": data.connections_opened,
    }


# -- report ---------------------------------------------------------------------------

COLUMNS = [
    ("scenario", "scenario"), ("speed", "speed"), ("offered", "offered"), ("success %", "success_pct"),
    ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"), ("TTFT p50 ms", "ttft_p50_ms"), ("TTFT p99 ms", "ttft_p99_ms"),
    ("429s to clients", "client_429"), ("(gateway / upstream)", "client_429_split"), ("other errors", "other_errors"),
    ("upstream attempts", "upstream_attempts"), ("upstream 429s", "upstream_429"), ("retries/req", "retries_per_request"),
    ("attempts/forwarded", "attempts_per_forwarded"), ("dropped", "dropped"), ("max in flight", "max_in_flight"),
    ("lag p99 ms", "dispatch_lag_p99_ms"), ("gw CPU %", "gw_cpu_pct"), ("sim CPU %", "sim_cpu_pct"),
]


def print_report(report: dict[str, Any]) -> None:
    machine, git, cfg, trace = report["machine"], report["git"], report["config"], report["trace"]
    print(f"\n## Trace replay ({git['commit']}, {machine['nproc']} CPUs {machine['cpu_model']}, {placement.describe(report['pinning'])})\n")
    print(f"Trace {Path(trace['path']).name}: minutes {cfg['start_minute']:g}-{cfg['start_minute'] + cfg['minutes']:g},"
          f" {trace['rows_in_window']} requests (prompt tokens capped at {cfg['context_cap']}: {trace['context_capped']};"
          f" output at {cfg['output_cap']}: {trace['output_capped']}); {'streaming' if cfg['stream'] else 'non-streaming'},"
          f" simulator latency {cfg['latency']} s, token delay {cfg['token_delay']} s.")
    limits = report["overload_limits"]
    print(f"Peak 60-s rate of the window at 1x: {report['peak_1x']['rpm']:.0f} req/min, {report['peak_1x']['tpm']:,.0f} tokens/min;"
          f" overload: simulator rpm {limits['rpm']}, tpm {limits['tpm']:,}; tenant rpm {limits['tenant_rpm']},"
          f" tpm {limits['tenant_tpm']:,} ({cfg['tenant_share']:g}x), max_queue {cfg['max_queue']}, max_wait_s"
          f" {cfg['max_wait']}; tenant buckets {cfg['drain']:.0%} drained before the replay. Storm: 429 rate {cfg['fail_429_rate']}, retry-after"
          f" {cfg['retry_after']} s, max_attempts {cfg['max_attempts']}, budget_ratio {cfg['budget_ratio']}.\n")
    rows = [r | {"client_429_split": f"{r['client_429_gateway']} / {r['client_429_upstream']}", "speed": f"{r['speed']:g}x"}
            for r in report["runs"]]
    print(markdown_table(COLUMNS, rows))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    rows, trace_info = load_window(args.trace, args.start_minute, args.minutes, args.context_cap, args.output_cap)
    if not rows:
        print("no trace rows in the window", file=sys.stderr)
        return 2
    bank = PromptBank(args.context_cap, args.bucket_tokens, args.seed)
    for row in rows:
        bank.text(row.context)
    bank.measure()
    errors = [abs(bank.measured[bank.target(r.context)] - r.context) for r in rows]
    trace_info["prompt_tokens_abs_error_mean"] = round(sum(errors) / len(errors), 1)
    trace_info["prompt_buckets"] = len(bank.measured)
    peak = peak_rates(rows, args.minutes * 60)
    limits = {"rpm": args.rpm or max(1, round(args.overload_ratio * peak["rpm"])),
              "tpm": args.tpm or max(args.context_cap + args.output_cap, round(args.overload_ratio * peak["tpm"]))}
    limits |= {"tenant_rpm": max(1, math.floor(limits["rpm"] * args.tenant_share)),
               "tenant_tpm": max(1, math.floor(limits["tpm"] * args.tenant_share))}
    report: dict[str, Any] = {
        **run_header("trace_replay", args_config(args) | {"event_loop": "uvloop"}),
        "trace": trace_info,
        "peak_1x": peak,
        "overload_limits": limits,
    }
    runs = []
    with workspace("gateway-bench-trace-") as workdir:
        place = placement.from_args(args)
        report["pinning"] = placement.report(place)
        placement.join_load_core(place)
        print(f"{len(rows)} requests in the window; peak at 1x {peak['rpm']:.0f} rpm / {peak['tpm']:,.0f} tpm;"
              f" overload limits {limits}; {placement.describe(report['pinning'])}", file=sys.stderr, flush=True)
        for speed in args.speeds:
            for scenario in args.scenarios:
                tag = f"-{scenario}-{speed:g}x"
                run = run_one(workdir, place, scenario, speed, rows, bank, args, limits, tag)
                runs.append(run)
                print(f"  {scenario:8s} {speed:g}x: offered {run['offered']}, ok {run['success_pct']}%, p50 {run['p50_ms']} ms,"
                      f" p99 {run['p99_ms']} ms, 429s {run['client_429']}, attempts {run['upstream_attempts']},"
                      f" dropped {run['dropped']}, {run['elapsed_s']} s", file=sys.stderr, flush=True)
    report["runs"] = runs
    print_report(report)
    path = write_json("trace", report, args.out_dir)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    procs.run_script(main)
