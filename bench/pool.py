"""A pool of vLLM simulator replicas as one cache-aware upstream (issue 33): the same
trace-driven requests, in one run, sent four ways.

- round-robin: straight to the replicas in turn (what a plain load balancer does);
- oracle: straight to the replicas, each tenant always to one replica, the tenants
  spread by their traffic (ideal affinity, known in advance);
- gateway: through one gateway process, the pool settings at their defaults;
- 2 gateways: two gateway processes sharing Redis, each request to either at random.

The workload: arrival times and output lengths from the Azure LLM conversation trace
(`/work/shared/traces/`), replayed open loop at `--speed`x; each request is one tenant's
(tenants Zipf-weighted), its ~600-token system prompt then a user turn of its own whose
length is the trace row's prompt length x `--user-scale`. Every request carries its
tenant's `cache_salt` as the gateway sends it (the direct arms add it themselves). The
replicas have bounded KV (room for about `--kv-prefixes` of the tenants' prompts each),
a prefill cost per uncached token and a decode cost per token, and are reset (empty
cache, counters at zero) before each arm.

Per arm: cached-token share (the replicas' `vllm:prefix_cache_hits / queries`), time to
first token at the client, and the busiest replica's share of the requests; then the
issue's targets as ratios. Markdown on stdout, JSON in bench/out/.

    .venv/bin/python bench/pool.py            # ~3.5 min: 15 s warm-up + 25 s measured per arm, at 8x
    .venv/bin/python bench/pool.py --quick    # ~1.5 min smoke run: 6 s + 8 s per arm
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
import uvloop

from bench import pool_stack, procs
from bench.gwstack import ConnectionPool, get_json, install_signal_handlers, workspace
from bench.report import add_output_options, args_config, markdown_table, run_header, write_json
from bench.stats import percentile
from bench.trace_replay import DEFAULT_TRACE, START_LEAD_S, Outcome, Row, load_window, one_request
from bench.workload import WORDS
from gateway.auth.keys import key_digest, new_api_key
from gateway.caching.keys import tenant_scope
from gateway.caching.salts import TenantSalts
from gateway.upstreams.pool_metrics import ReplicaMetrics

ARMS = ("round-robin", "oracle", "gateway", "2 gateways")
GATEWAY_ARMS = ("gateway", "2 gateways")
SYSTEM_TOKENS = 600
BLOCK_TOKENS = 16


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help=f"trace CSV (default {DEFAULT_TRACE})")
    parser.add_argument("--duration", type=float, default=25.0, help="wall seconds of measured replay per arm (default 25)")
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="wall seconds of the trace replayed before it, per arm, not measured: caches filled, homes placed (default 15)")
    parser.add_argument("--speed", type=float, default=8.0,
                        help="replay speed (default 8: ~35 requests/s, where round-robin's cold prefills queue)")
    parser.add_argument("--start-minute", type=float, default=0.0, help="where the window starts in the trace")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--skew", type=float, default=0.8, help="Zipf exponent of the tenants' traffic (default 0.8)")
    parser.add_argument("--kv-prefixes", type=float, default=7.0, help="each replica's KV room, in tenants' prompts (default 7)")
    parser.add_argument("--user-scale", type=float, default=1 / 64, help="user turn tokens per trace prompt token (default 1/64)")
    parser.add_argument("--output-scale", type=float, default=1 / 8, help="max_tokens per trace output token (default 1/8)")
    parser.add_argument("--output-cap", type=int, default=64, help="cap on max_tokens (default 64)")
    parser.add_argument("--max-num-seqs", type=int, default=4, help="requests a replica runs at once (default 4)")
    parser.add_argument("--prefill-s-per-token", type=float, default=0.0004, help="replica prefill per uncached token (default 0.0004)")
    parser.add_argument("--decode-s-per-token", type=float, default=0.004, help="replica decode per token (default 0.004)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379", help="for the 2-gateway arm")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, some of: {', '.join(ARMS)}")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="smoke run: 6 s of warm-up and 8 s measured per arm")
    add_output_options(parser, pinning=False)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup = min(args.duration, 8.0), min(args.warmup, 6.0)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not set(args.arms) <= set(ARMS):
        parser.error(f"--arms: some of {', '.join(ARMS)}")
    if args.replicas < 2 or args.tenants < args.replicas or not 0 < args.duration <= 600 or args.warmup < 0 or not 0 < args.speed <= 64:
        parser.error("--replicas >= 2, --tenants >= --replicas, --duration in (0, 600], --speed in (0, 64]")
    return args


# -- the workload (pure) ----------------------------------------------------------------


def tenant_weights(tenants: int, skew: float) -> list[float]:
    """Zipf: tenant i's share of the traffic is proportional to 1 / (i + 1) ** skew."""
    raw = [1 / (i + 1) ** skew for i in range(tenants)]
    total = sum(raw)
    return [w / total for w in raw]


def oracle_assignment(weights: Sequence[float], replicas: int) -> list[int]:
    """Each tenant to one replica, heaviest first onto the least loaded (longest
    processing time first): the ideal affinity, with the traffic known in advance."""
    load = [0.0] * replicas
    home = [0] * len(weights)
    for tenant in sorted(range(len(weights)), key=lambda t: -weights[t]):
        replica = min(range(replicas), key=lambda r: (load[r], r))
        home[tenant] = replica
        load[replica] += weights[tenant]
    return home


def words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, count)))


@dataclass(frozen=True)
class Workload:
    rows: list[Row]
    tenant_of: list[int]  # per row
    systems: list[str]  # per tenant
    users: list[str]  # per row
    outputs: list[int]  # per row: max_tokens

    def messages(self, index: int) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.systems[self.tenant_of[index]]}, {"role": "user", "content": self.users[index]}]


def build_workload(rows: list[Row], args: argparse.Namespace) -> Workload:
    rng = random.Random(args.seed)
    weights = tenant_weights(args.tenants, args.skew)
    tenant_of = rng.choices(range(args.tenants), weights, k=len(rows))
    systems = [f"You are the assistant of tenant {t}. " + words(SYSTEM_TOKENS - 8, rng) for t in range(args.tenants)]
    users = [words(round(r.raw_context * args.user_scale), rng) for r in rows]
    outputs = [max(1, min(args.output_cap, round(r.raw_generated * args.output_scale))) for r in rows]
    return Workload(rows, tenant_of, systems, users, outputs)


def kv_blocks(args: argparse.Namespace, workload: Workload) -> int:
    """Room for `kv_prefixes` of the tenants' average request (system prompt, user turn, output)."""
    users = sum(len(u.split()) for u in workload.users) / max(1, len(workload.users))
    outputs = sum(workload.outputs) / max(1, len(workload.outputs))
    return math.ceil(args.kv_prefixes * (SYSTEM_TOKENS + users + outputs + 10) / BLOCK_TOKENS)


# -- the measures (pure) ----------------------------------------------------------------


def summarize(outcomes: Sequence[Outcome], before: Sequence[ReplicaMetrics], after: Sequence[ReplicaMetrics]) -> dict[str, Any]:
    """One arm's measures: TTFT at the client; cached share and requests per replica from
    the replicas' counters, `after` less `before` (the measured part of the replay)."""
    ttfts = [o.ttft_s for o in outcomes if o.error is None and not math.isnan(o.ttft_s)]
    pairs = list(zip(before, after, strict=True))
    queries = sum(a.prefix_queries - b.prefix_queries for b, a in pairs)
    hits = sum(a.prefix_hits - b.prefix_hits for b, a in pairs)
    served = [round(a.e2e_count - b.e2e_count) for b, a in pairs]
    per_replica = [_ratio(a.prefix_hits - b.prefix_hits, a.prefix_queries - b.prefix_queries) for b, a in pairs]
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.error is not None:
            errors[o.error] = errors.get(o.error, 0) + 1
    return {
        "requests": len(outcomes), "errors": sum(errors.values()), "error_kinds": errors,
        "cached_share": hits / queries if queries else math.nan,
        "ttft_p50_ms": percentile(ttfts, 50) * 1000, "ttft_p95_ms": percentile(ttfts, 95) * 1000,
        "busiest_share": max(served) / sum(served) if sum(served) else math.nan, "requests_per_replica": served,
        "cached_share_per_replica": [round(c, 3) for c in per_replica],
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def verdict(arms: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Issue 33's "Done when" targets, for each gateway arm that ran."""
    rr, oracle, one = arms.get("round-robin"), arms.get("oracle"), arms.get("gateway")
    checks: list[dict[str, Any]] = []

    def check(name: str, value: float, target: str, met: bool) -> None:
        checks.append({"check": name, "value": round(value, 3), "target": target, "met": bool(met)})

    for arm in GATEWAY_ARMS:
        gw = arms.get(arm)
        if gw is None:
            continue
        if rr is not None:
            cached = _ratio(gw["cached_share"], rr["cached_share"])
            check(f"{arm}: cached share / round-robin's", cached, ">= 2", cached >= 2)
            ttft = _ratio(gw["ttft_p95_ms"], rr["ttft_p95_ms"])
            check(f"{arm}: p95 TTFT / round-robin's", ttft, "<= 0.7", ttft <= 0.7)
        if oracle is not None:
            near = _ratio(gw["cached_share"], oracle["cached_share"])
            check(f"{arm}: cached share / oracle's", near, ">= 0.9", near >= 0.9)
        check(f"{arm}: busiest replica's share of requests", gw["busiest_share"], "<= 0.4", gw["busiest_share"] <= 0.4)
    two = arms.get("2 gateways")
    if one is not None and two is not None:
        same = _ratio(two["cached_share"], one["cached_share"])
        check("2 gateways: cached share / 1 gateway's", same, "0.95 - 1.05", abs(same - 1) <= 0.05)
    return checks


# -- the runs ---------------------------------------------------------------------------

Send = Callable[[int], tuple[ConnectionPool, dict[str, str], bytes]]


async def replay(rows: Sequence[Row], send: Send, speed: float, timeout_s: float) -> list[Outcome]:
    """Open loop: each row at its trace time / speed, whether or not earlier ones are done."""
    loop = asyncio.get_running_loop()
    start = loop.time() + START_LEAD_S
    first = rows[0].t_s if rows else 0.0
    tasks = []
    for row in rows:
        delay = start + (row.t_s - first) / speed - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        pool, headers, body = send(row.index)
        tasks.append(asyncio.create_task(one_request(pool, headers, body, row, True, timeout_s)))
    return list(await asyncio.gather(*tasks))


def body(workload: Workload, index: int, salt: str | None) -> bytes:
    payload: dict[str, Any] = {"model": pool_stack.MODEL, "messages": workload.messages(index), "max_tokens": workload.outputs[index],
                               "ignore_eos": True, "stream": True}
    if salt is not None:
        payload["cache_salt"] = salt
    return orjson.dumps(payload)


class Bench:
    def __init__(self, args: argparse.Namespace, workload: Workload, workdir: Path, exits: ExitStack) -> None:
        self.args, self.workload, self.workdir = args, workload, workdir
        self.secret = secrets.token_hex(16)
        salts = TenantSalts(self.secret.encode())
        self.tenants = [f"tenant{t:02d}" for t in range(args.tenants)]
        self.salts = [salts.cache_salt(tenant_scope(t)) for t in self.tenants]  # as the gateway derives them
        self.keys = [new_api_key() for _ in self.tenants]
        self.admin_key = "adm-" + secrets.token_hex(16)
        flags = ["--num-gpu-blocks", str(kv_blocks(args, workload)), "--block-size", str(BLOCK_TOKENS),
                 "--max-num-seqs", str(args.max_num_seqs), "--prefill-s-per-token", str(args.prefill_s_per_token),
                 "--decode-s-per-token", str(args.decode_s_per_token)]
        self.replicas = pool_stack.start_replicas(args.replicas, flags, workdir, exits)
        self.runner = exits.enter_context(asyncio.Runner(loop_factory=uvloop.new_event_loop))
        self.runner.run(self._warm())

    async def _warm(self) -> None:
        """Each replica loads its tokenizer on its first request: not in any arm's figures."""
        for port in self.replicas:
            pool = ConnectionPool(port)
            await one_request(pool, {"Content-Type": "application/json"}, body(self.workload, 0, "warm"), self.workload.rows[0], True, 30)
            pool.close()

    def run(self, arm: str) -> dict[str, Any]:
        for port in self.replicas:
            pool_stack.reset_replica(port)
        extra: dict[str, Any] = {}
        cut = self.args.warmup * self.args.speed
        warmup = [r for r in self.workload.rows if r.t_s < cut]
        measured = [r for r in self.workload.rows if r.t_s >= cut]
        with ExitStack() as exits:
            send = self._sender(arm, exits, extra)
            warm = self.runner.run(replay(warmup, send, self.args.speed, 60.0))
            before = [pool_stack.replica_metrics(p) for p in self.replicas]
            outcomes = self.runner.run(replay(measured, send, self.args.speed, 60.0))
            after = [pool_stack.replica_metrics(p) for p in self.replicas]
            if arm in GATEWAY_ARMS:
                extra["gateway_view"] = [get_json(p, "/admin/pool", {"Authorization": f"Bearer {self.admin_key}"})
                                         for p in extra.pop("ports")]
        extra["warmup"] = {"requests": len(warm), "errors": sum(o.error is not None for o in warm)}
        return summarize(outcomes, before, after) | extra

    def _sender(self, arm: str, exits: ExitStack, extra: dict[str, Any]) -> Send:
        wl, json = self.workload, {"Content-Type": "application/json"}
        if arm in ("round-robin", "oracle"):
            pools = [ConnectionPool(p) for p in self.replicas]
            exits.callback(lambda: [p.close() for p in pools])
            home = oracle_assignment(tenant_weights(self.args.tenants, self.args.skew), len(pools))

            def direct(i: int) -> tuple[ConnectionPool, dict[str, str], bytes]:
                tenant = wl.tenant_of[i]
                replica = i % len(pools) if arm == "round-robin" else home[tenant]
                return pools[replica], json, body(wl, i, self.salts[tenant])
            return direct
        count = 1 if arm == "gateway" else 2
        env = {"GATEWAY_SECRET": self.secret, "GATEWAY_ADMIN_KEY": self.admin_key}
        if count > 1:
            env |= {"REDIS_URL": self.args.redis_url, "GATEWAY_REDIS_PREFIX": "benchpool-" + secrets.token_hex(6)}
        policy = pool_stack.pool_policy(self.replicas, {t: key_digest(k) for t, k in zip(self.tenants, self.keys, strict=True)})
        ports = pool_stack.start_gateways(count, policy, env, self.workdir, exits, arm.replace(" ", "-"))
        for port in ports:
            pool_stack.wait_for_scrapes(port, self.admin_key, len(self.replicas))
        extra["ports"] = ports
        gw_pools = [ConnectionPool(p) for p in ports]
        exits.callback(lambda: [p.close() for p in gw_pools])
        rng = random.Random(self.args.seed)

        def through(i: int) -> tuple[ConnectionPool, dict[str, str], bytes]:
            tenant = wl.tenant_of[i]
            return rng.choice(gw_pools), json | {"Authorization": f"Bearer {self.keys[tenant]}"}, body(wl, i, None)
        return through


COLUMNS = [("arm", "arm"), ("requests", "requests"), ("errors", "errors"), ("cached share", "cached_share"),
           ("TTFT p50 ms", "ttft_p50_ms"), ("TTFT p95 ms", "ttft_p95_ms"), ("busiest replica", "busiest_share"),
           ("requests per replica", "per_replica")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    rows, trace = load_window(args.trace, args.start_minute, (args.warmup + args.duration) * args.speed / 60, 10**9, 10**9)
    workload = build_workload(rows, args)
    report = run_header("pool", args_config(args)) | {"trace": trace, "kv_blocks_per_replica": kv_blocks(args, workload)}
    began = time.perf_counter()
    arms: dict[str, dict[str, Any]] = {}
    with workspace("bench-pool-") as workdir, ExitStack() as exits:
        bench = Bench(args, workload, workdir, exits)
        for arm in args.arms:
            print(f"{arm}: {len(rows)} requests over {args.warmup + args.duration:.0f} s ...", file=sys.stderr, flush=True)
            arms[arm] = bench.run(arm)
    checks = verdict(arms)
    report |= {"arms": arms, "checks": checks, "seconds": round(time.perf_counter() - began, 1)}
    table = [{"arm": a, **r, "per_replica": " / ".join(map(str, r["requests_per_replica"]))} for a, r in arms.items()]
    measured = next(iter(arms.values()))["requests"] if arms else 0
    print(f"\n{measured} requests measured per arm after {len(rows) - measured} to warm up, {args.tenants} tenants, {args.replicas} replicas of {report['kv_blocks_per_replica']}"
          f" KV blocks, {args.speed:g}x the trace\n")
    print(markdown_table(COLUMNS, table))
    print("\n" + markdown_table([("check", "check"), ("value", "value"), ("target", "target"), ("met", "met")], checks))
    path = write_json("pool", report, args.out_dir)
    print(f"\nJSON: {path}")
    errors = sum(r["errors"] + r["warmup"]["errors"] for r in arms.values())
    return 1 if errors or not all(c["met"] for c in checks) else 0


if __name__ == "__main__":
    procs.run_script(main)
