"""Response cache and provider prefix caching through the gateway: hit ratio, hit vs
miss latency, and what the workload cost, what caching saved, and what it would have
cost with no caching at all.

Workload (seeded, built before the run): N chat requests at `temperature: 0`. A
fraction are exact repeats of an earlier request (byte-identical bodies); the rest are
new: one of a few long shared system prompts (~1,500 tokens, so the provider's
automatic prefix caching applies) plus a question of their own. The gateway's response
cache may answer repeats; new requests go to the simulator, which reports the cached
prefix in `usage.prompt_tokens_details.cached_tokens`.

    .venv/bin/python bench/cache.py            # 2,000 requests, 40 % repeats, concurrency 8
    .venv/bin/python bench/cache.py --quick    # ~1 min smoke run: 400 requests
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from decimal import Decimal
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
    PRICE,
    ConnectionPool,
    Stack,
    base_policy,
    install_signal_handlers,
    workspace,
)
from bench.report import add_output_options, args_config, markdown_table, run_header, write_json
from bench.stats import percentile
from bench.workload import WORDS
from gateway.tokens.counting import count_chat_tokens

REQUEST_TIMEOUT_S = 60.0
SETTLE_S = 1.0  # lets the ledger's group-commit writer book the last requests before /admin/costs is read
MILLION = Decimal(1_000_000)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests in the workload (default 2000)")
    parser.add_argument("--repeat-fraction", type=float, default=0.4, help="share of exact repeats (default 0.4)")
    parser.add_argument("--concurrency", type=int, default=8, help="closed-loop workers (default 8)")
    parser.add_argument("--prefixes", type=int, default=4, help="distinct shared system prompts (default 4)")
    parser.add_argument("--prefix-tokens", type=int, default=1500, help="tokens per shared system prompt (default 1500)")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens sent (default 256; above --output-tokens,"
                        " so answers finish with `stop` and are cacheable)")
    parser.add_argument("--output-tokens", type=int, default=100, help="simulator's natural answer length (default 100)")
    parser.add_argument("--latency", type=float, default=0.2, help="simulator seconds before answering (default 0.2)")
    parser.add_argument("--ttl", type=float, default=3600.0, help="tenant response_ttl_s (default 3600)")
    parser.add_argument("--seed", type=int, default=7, help="workload seed (default 7)")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop sending after this long (default 600)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 400 requests")
    add_output_options(parser, pinning=True)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests = min(args.requests, 400)
    if not 1 <= args.requests <= 100_000:
        parser.error("--requests: 1 to 100000")
    if not 0 <= args.repeat_fraction < 1:
        parser.error("--repeat-fraction: within [0, 1)")
    if not 1 <= args.concurrency <= 256 or not 1 <= args.prefixes <= 64:
        parser.error("--concurrency: 1 to 256; --prefixes: 1 to 64")
    if not 1100 <= args.prefix_tokens <= 16_000:
        parser.error("--prefix-tokens: 1100 to 16000 (prefix caching starts at 1024 tokens)")
    if not 0 < args.max_seconds <= 3600:
        parser.error("--max-seconds: (0, 3600]")
    return args


# -- the workload -------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    index: int
    kind: str  # "new" | "repeat"
    source: int  # index of the new request it repeats (itself when new)
    prefix: int
    body: bytes


def words(rng: random.Random, n: int) -> str:
    """n common words, one o200k token each (so n tokens)."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def system_prompts(count: int, tokens: int, seed: int) -> list[str]:
    """Distinct long instructions; each starts differently so they share no prefix."""
    prompts = []
    for p in range(count):
        rng = random.Random(f"prefix-{seed}-{p}")
        head = f"You are assistant number {p} of the bench team. Follow these house rules:"
        prompts.append(head + " " + words(rng, max(0, tokens - 16)))
    return prompts


def build_workload(args: argparse.Namespace) -> tuple[list[Item], list[str]]:
    """The first `gap` requests are new; `repeat_fraction` of the rest (chosen at random)
    repeat a new request at least `gap` positions earlier, so that with closed-loop
    concurrency C and gap = 2C the original has almost surely finished (and been
    stored) when the repeat is sent."""
    rng = random.Random(args.seed)
    prompts = system_prompts(args.prefixes, args.prefix_tokens, args.seed)
    n, gap = args.requests, 2 * args.concurrency
    repeats = round(n * args.repeat_fraction)
    eligible = list(range(min(gap, n), n))
    repeat_at = set(rng.sample(eligible, min(repeats, len(eligible))))
    items: list[Item] = []
    new_indexes: list[int] = []
    for i in range(n):
        if i in repeat_at:
            candidates = [j for j in new_indexes if j <= i - gap]
            if candidates:
                original = items[rng.choice(candidates)]
                items.append(Item(i, "repeat", original.index, original.prefix, original.body))
                continue
        prefix = rng.randrange(args.prefixes)
        question = f"Question {i}: {words(rng, rng.randint(12, 40))}?"
        body = {
            "model": MODEL,
            "messages": [{"role": "system", "content": prompts[prefix]}, {"role": "user", "content": question}],
            "temperature": 0,
            "max_tokens": args.max_tokens,
        }
        items.append(Item(i, "new", i, prefix, orjson.dumps(body)))
        new_indexes.append(i)
    return items, prompts


# -- the run --------------------------------------------------------------------------


@dataclass
class Result:
    index: int
    kind: str
    status: int | None = None
    error: str | None = None
    latency_s: float = math.nan
    cache: str | None = None  # x-gateway-cache
    cost_usd: Decimal | None = None  # x-gateway-cost-usd
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None


@dataclass
class RunData:
    results: list[Result] = field(default_factory=list)
    elapsed_s: float = 0.0
    connections_opened: int = 0


async def send(pool: ConnectionPool, headers: dict[str, str], item: Item) -> Result:
    result = Result(item.index, item.kind)
    parts: list[bytes] = []
    start = time.perf_counter()
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            status, reply_headers = await pool.post(CHAT_PATH, item.body, headers, parts.append)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        result.error = type(exc).__name__
        return result
    result.latency_s = time.perf_counter() - start
    result.status = status
    result.cache = reply_headers.get("x-gateway-cache")
    cost = reply_headers.get("x-gateway-cost-usd")
    result.cost_usd = Decimal(cost) if cost is not None else None
    if status != 200:
        result.error = f"http_{status}"
        return result
    try:
        body = orjson.loads(b"".join(parts))
        usage = body.get("usage") or {}
        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        result.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        result.completion_tokens = int(usage.get("completion_tokens") or 0)
        result.finish_reason = (body.get("choices") or [{}])[0].get("finish_reason")
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError, IndexError):
        result.error = "bad_body"
    return result


async def run_workload(stack: Stack, items: list[Item], concurrency: int, max_seconds: float) -> RunData:
    pool = ConnectionPool(stack.gateway_port)
    headers = stack.client_headers()
    data = RunData()
    next_index = 0
    deadline = time.perf_counter() + max_seconds

    async def worker() -> None:
        nonlocal next_index
        while next_index < len(items) and time.perf_counter() < deadline:
            item = items[next_index]
            next_index += 1
            data.results.append(await send(pool, headers, item))

    begin = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        data.elapsed_s = time.perf_counter() - begin
        data.connections_opened = pool.opened
        pool.close()
    return data


async def warm_up(stack: Stack, concurrency: int) -> list[Result]:
    """One round of `concurrency` short, sampled (temperature 1: never cached) requests,
    so first-request costs (the simulator loads its tokenizer on its first request,
    ~0.5 s) stay out of the figures. Their ledger rows are subtracted below."""
    pool = ConnectionPool(stack.gateway_port)
    headers = stack.client_headers()
    items = [Item(-1 - i, "warm-up", -1 - i, -1, orjson.dumps({
        "model": MODEL, "messages": [{"role": "user", "content": f"Warm-up {i}: say hello."}], "temperature": 1,
        "max_tokens": 16})) for i in range(concurrency)]
    try:
        return list(await asyncio.gather(*(send(pool, headers, item) for item in items)))
    finally:
        pool.close()


def diff_row(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """/admin/costs row minus the same tenant's row before the run (the warm-up)."""
    old: dict[str, Any] = next((r for r in before.get("rows") or [] if r.get("tenant") == after.get("tenant")), {})
    out: dict[str, Any] = {"tenant": after.get("tenant")}
    for key, value in after.items():
        if key.endswith("_usd"):
            out[key] = str(Decimal(str(value)) - Decimal(str(old.get(key, "0"))))
        elif isinstance(value, int):
            out[key] = value - int(old.get(key, 0))
    return out


# -- the figures ----------------------------------------------------------------------


def _ms(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1000, 2) if values else math.nan


def _usd(value: Decimal) -> float:
    return float(round(value, 6))


def price(name: str) -> Decimal:
    return Decimal(str(PRICE[name]))


def list_price(r: Result) -> Decimal:
    """What the call would cost with no caching of any kind: every prompt token at the full input price."""
    return (r.prompt_tokens * price("input") + r.completion_tokens * price("output")) / MILLION


def billed_price(r: Result) -> Decimal:
    """What the provider bills for the call as reported: cached prompt tokens at the cached price."""
    uncached = max(r.prompt_tokens - r.cached_tokens, 0)
    return (uncached * price("input") + r.cached_tokens * price("cached_input") + r.completion_tokens * price("output")) / MILLION


def figures(items: list[Item], data: RunData, admin: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    results = data.results
    ok = [r for r in results if r.status == 200 and r.error is None]
    hits = [r for r in ok if r.cache == "hit"]
    misses = [r for r in ok if r.cache == "miss"]
    other = [r for r in ok if r.cache not in ("hit", "miss")]
    repeats_sent = [r for r in results if r.kind == "repeat"]
    hit_lat = [r.latency_s for r in hits]
    miss_lat = [r.latency_s for r in misses]
    miss_prompt = sum(r.prompt_tokens for r in misses)
    miss_cached = sum(r.cached_tokens for r in misses)
    header_cost = sum((r.cost_usd for r in ok if r.cost_usd is not None), Decimal(0))
    no_cache = sum((list_price(r) for r in ok), Decimal(0))
    miss_billed = sum((billed_price(r) for r in misses), Decimal(0))
    prefix_saved = sum((list_price(r) - billed_price(r) for r in misses), Decimal(0))
    # A hit's ledger row saves what the replaced call would cost at the stored usage
    # (which carries the original call's cached tokens), not its list price.
    hit_saved_at_billed = sum((billed_price(r) for r in hits), Decimal(0))
    hit_saved_at_list = sum((list_price(r) for r in hits), Decimal(0))
    rows = admin.get("rows") or []
    row: dict[str, Any] = next((r for r in rows if r.get("tenant") == "acme"), {})
    admin_cost = Decimal(str(row.get("cost_usd", "0")))
    admin_saved = Decimal(str(row.get("saved_usd", "0")))
    error_kinds: dict[str, int] = {}
    for r in results:
        if r.error is not None:
            error_kinds[r.error] = error_kinds.get(r.error, 0) + 1
    p50_ratio = percentile(miss_lat, 50) / percentile(hit_lat, 50) if hits and misses else math.nan
    p99_ratio = percentile(miss_lat, 99) / percentile(hit_lat, 99) if hits and misses else math.nan
    return {
        "requests_planned": len(items),
        "requests_sent": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_kinds": error_kinds,
        "elapsed_s": round(data.elapsed_s, 2),
        "rps": round(len(results) / data.elapsed_s, 1) if data.elapsed_s else math.nan,
        "connections_opened": data.connections_opened,
        "repeats_sent": len(repeats_sent),
        "repeat_share_sent": round(len(repeats_sent) / len(results), 4) if results else math.nan,
        "hits": len(hits),
        "misses": len(misses),
        "other_cache_status": len(other),
        "hit_ratio": round(len(hits) / len(ok), 4) if ok else math.nan,
        "repeats_that_hit": sum(1 for r in hits if r.kind == "repeat"),
        "new_that_hit": sum(1 for r in hits if r.kind == "new"),
        "repeats_that_missed": sum(1 for r in misses if r.kind == "repeat"),
        "finish_reasons": {k: sum(1 for r in ok if r.finish_reason == k) for k in sorted({str(r.finish_reason) for r in ok})},
        "hit_p50_ms": _ms(hit_lat, 50), "hit_p99_ms": _ms(hit_lat, 99),
        "miss_p50_ms": _ms(miss_lat, 50), "miss_p99_ms": _ms(miss_lat, 99),
        "miss_over_hit_p50": round(p50_ratio, 1) if not math.isnan(p50_ratio) else math.nan,
        "miss_over_hit_p99": round(p99_ratio, 1) if not math.isnan(p99_ratio) else math.nan,
        "miss_prompt_tokens": miss_prompt,
        "miss_cached_tokens": miss_cached,
        "miss_cached_share": round(miss_cached / miss_prompt, 4) if miss_prompt else math.nan,
        "misses_with_cached_prefix": sum(1 for r in misses if r.cached_tokens > 0),
        "upstream_requests": sim.get("requests"),
        "upstream_by_status": sim.get("by_status"),
        "usd": {
            "cost_sum_of_headers": _usd(header_cost),
            "cost_from_usage_misses": _usd(miss_billed),
            "cost_admin": _usd(admin_cost),
            "saved_admin": _usd(admin_saved),
            "no_cache": _usd(no_cache),
            "saved_prefix_from_usage": _usd(prefix_saved),
            "saved_hits_at_billed_price": _usd(hit_saved_at_billed),
            "saved_hits_at_list_price": _usd(hit_saved_at_list),
            "saved_expected": _usd(prefix_saved + hit_saved_at_billed),
            "no_cache_minus_cost": _usd(no_cache - header_cost),
            "cost_plus_saved_admin": _usd(header_cost + admin_saved),
        },
        "admin_row": row,
    }


# -- report ---------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    f, cfg, machine, git = report["figures"], report["config"], report["machine"], report["git"]
    usd = f["usd"]
    print(f"\n## Response cache + prefix caching ({git['commit']}, {machine['nproc']} CPUs {machine['cpu_model']},"
          f" {placement.describe(report['pinning'])})\n")
    print(f"{f['requests_sent']} requests ({f['repeats_sent']} exact repeats, {f['repeat_share_sent']:.1%}), concurrency"
          f" {cfg['concurrency']}, {cfg['prefixes']} shared system prompts of ~{cfg['prefix_tokens']} tokens,"
          f" simulator latency {cfg['latency']} s, {f['elapsed_s']} s, {f['rps']} req/s, errors {f['errors']}.\n")
    print(markdown_table([("metric", "metric"), ("value", "value")], [
        {"metric": "response-cache hit ratio (x-gateway-cache: hit / 200s)", "value": f"{f['hit_ratio']:.2%} ({f['hits']} hits, {f['misses']} misses)"},
        {"metric": "repeats that hit / repeats sent", "value": f"{f['repeats_that_hit']} / {f['repeats_sent']}"},
        {"metric": "hit latency p50 / p99 (ms)", "value": f"{f['hit_p50_ms']} / {f['hit_p99_ms']}"},
        {"metric": "miss latency p50 / p99 (ms)", "value": f"{f['miss_p50_ms']} / {f['miss_p99_ms']}"},
        {"metric": "miss / hit latency, p50 and p99", "value": f"{f['miss_over_hit_p50']}x / {f['miss_over_hit_p99']}x"},
        {"metric": "provider cached-token share of miss prompts", "value": f"{f['miss_cached_share']:.2%} ({f['miss_cached_tokens']:,} of {f['miss_prompt_tokens']:,}; {f['misses_with_cached_prefix']} of {f['misses']} misses had a cached prefix)"},
        {"metric": "upstream requests (simulator)", "value": f"{f['upstream_requests']}"},
        {"metric": "workload cost: sum of x-gateway-cost-usd", "value": f"${usd['cost_sum_of_headers']:.6f}"},
        {"metric": "workload cost: /admin/costs cost_usd", "value": f"${usd['cost_admin']:.6f}"},
        {"metric": "saved: /admin/costs saved_usd", "value": f"${usd['saved_admin']:.6f}"},
        {"metric": "  expected saved (prefix discount on misses + billed price of hits)", "value": f"${usd['saved_expected']:.6f} (${usd['saved_prefix_from_usage']:.6f} + ${usd['saved_hits_at_billed_price']:.6f})"},
        {"metric": "no caching at all (all 200s, usage x list price)", "value": f"${usd['no_cache']:.6f}"},
        {"metric": "no caching minus cost (total saved, list-price basis)", "value": f"${usd['no_cache_minus_cost']:.6f} ({usd['no_cache_minus_cost'] / usd['no_cache']:.1%} of no-cache)" if usd['no_cache'] else "-"},
    ]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    items, prompts = build_workload(args)
    prompt_tokens = [count_chat_tokens([{"role": "system", "content": p}]) for p in prompts]
    report: dict[str, Any] = run_header("cache", args_config(args) | {
        "system_prompt_tokens_o200k": prompt_tokens, "request_timeout_s": REQUEST_TIMEOUT_S,
        "price_usd_per_1m": PRICE, "event_loop": "uvloop"})
    with workspace("gateway-bench-cache-") as workdir, ExitStack() as exits:
        place = placement.from_args(args)
        stack = Stack(workdir, exits, place)
        stack.start_simulator(["--latency", str(args.latency), "--output-tokens", str(args.output_tokens)])
        policy = base_policy(stack.sim_port, stack.digest)
        policy["tenants"]["acme"]["cache"] = {"response_ttl_s": args.ttl}
        stack.start_gateway(policy)
        report["policy"] = policy | {"tenants": {"acme": {**policy["tenants"]["acme"], "api_keys": ["<digest of the run's key>"]}}}
        report["pinning"] = placement.report(place)
        placement.join_load_core(place)
        print(f"workload: {len(items)} requests, {sum(1 for i in items if i.kind == 'repeat')} repeats;"
              f" system prompts {prompt_tokens} tokens; {placement.describe(report['pinning'])}", file=sys.stderr, flush=True)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            warm = runner.run(warm_up(stack, args.concurrency))
            runner.run(asyncio.sleep(SETTLE_S))
            admin_before, sim_before = stack.admin_costs(), stack.sim_stats()
            cpu_start = stack.cpu_seconds()
            data = runner.run(run_workload(stack, items, args.concurrency, args.max_seconds))
            runner.run(asyncio.sleep(SETTLE_S))
            cpu_end = stack.cpu_seconds()
        admin_after, sim_after = stack.admin_costs(), stack.sim_stats()
        admin = {"rows": [diff_row(after, admin_before) for after in admin_after.get("rows") or []]}
        sim = {"requests": sim_after["requests"] - sim_before["requests"],
               "by_status": {k: v - sim_before["by_status"].get(k, 0) for k, v in sim_after["by_status"].items()}}
        report["warm_up"] = {"requests": len(warm), "statuses": sorted({r.status for r in warm}, key=str),
                             "admin_costs_before_run": admin_before}
        report["figures"] = figures(items, data, admin, sim)
        report["cpu_ms_per_request"] = {name: round((cpu_end[name] - cpu_start[name]) * 1000 / max(1, len(data.results)), 3)
                                        for name in cpu_start}
        report["sim_stats"] = {k: sim.get(k) for k in ("requests", "by_status", "aborted", "injected_faults")}
        report["admin_costs"] = admin
        report["requests"] = [[r.index, r.kind, r.status, r.cache, round(r.latency_s * 1000, 2) if not math.isnan(r.latency_s) else None,
                               r.prompt_tokens, r.cached_tokens, r.completion_tokens, str(r.cost_usd) if r.cost_usd is not None else None]
                              for r in data.results]
        report["requests_columns"] = ["index", "kind", "status", "x-gateway-cache", "latency_ms", "prompt_tokens",
                                      "cached_tokens", "completion_tokens", "x-gateway-cost-usd"]
    print_report(report)
    path = write_json("cache", report, args.out_dir)
    print(f"\nJSON: {path}")
    return 1 if report["figures"]["errors"] else 0


if __name__ == "__main__":
    procs.run_script(main)
