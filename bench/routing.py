"""Cheap-first routing with verifiable escalation vs always-strong and always-cheap.

Starts the hosted simulator with quality profiles (`cheap` fails a verifiable check on
25 % of prompts and is silently wrong on 1 %; `strong`, 20x the price per token, is
silently wrong on 1 %) and a gateway whose route `auto` tries cheap first and
escalates to strong on failed checks. Sends the same 600 distinct tasks (JSON
extraction, tool calls, free text) as model=strong, model=cheap and model=auto, plus
a client-side reference (cheap; `gateway.verify`; strong if it failed) that shows what
the route should achieve. A task succeeds when the simulator's truth for the final
answer (`GET /sim/truth/{response id}`) is "correct". Prints a table and writes
bench/out/routing-<timestamp>.json.

    .venv/bin/python bench/routing.py                 # 600 tasks, ~1 min
    .venv/bin/python bench/routing.py --tasks 90      # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, NoReturn

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import yaml

from bench import procs
from bench.gwstack import workspace
from bench.report import add_output_options, markdown_table, run_header, write_json
from gateway.auth.keys import key_digest, new_api_key
from gateway.verify import Check, Verifier

PRICES = {"cheap": {"input": 0.15, "output": 0.60}, "strong": {"input": 3.00, "output": 12.00}}  # USD per 1M tokens
PROFILES = {"cheap": "0.25,0.01", "strong": "0.0,0.01"}  # check_fail_rate, silent_wrong_rate
REQUIRED_FIELDS = ["name", "email", "company"]
ESCALATE_WHEN: list[Any] = ["invalid_json", "schema_mismatch", {"missing_fields": REQUIRED_FIELDS}, "truncated",
                            "invalid_tool_call", "empty"]
CHECKS = [Check(s) for s in ESCALATE_WHEN if isinstance(s, str)] + [Check("missing_fields", tuple(REQUIRED_FIELDS))]
TARGET_SUCCESS_RATIO, TARGET_COST_RATIO = 0.99, 0.40
READY_TIMEOUT_S = 60.0
CONTACT = {"type": "object", "additionalProperties": False, "required": [*REQUIRED_FIELDS, "phone"], "properties": {
    "name": {"type": "string"}, "email": {"type": "string", "format": "email"}, "company": {"type": "string"},
    "phone": {"type": ["string", "null"]},
}}
LOOKUP_ORDER = {"type": "function", "function": {"name": "lookup_order", "description": "Find an order by id", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["order_id", "include_items"],
    "properties": {"order_id": {"type": "string"}, "include_items": {"type": "boolean"}},
}}}
RUNS = [("always-strong", "strong"), ("always-cheap", "cheap"), ("escalation", "auto"), ("reference (client-side)", "cheap>strong")]


def task_body(kind: str, i: int, seed: int) -> dict[str, Any]:
    """One distinct task; `max_tokens` leaves room for a full answer."""
    if kind == "extraction":
        return {"messages": [{"role": "system", "content": "Extract the sender's contact details as JSON."},
                             {"role": "user", "content": f"Email {seed}-{i}: Hi, this is person {i} at firm {i * 7 % 97}; write back."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "contact", "strict": True, "schema": CONTACT}},
                "max_tokens": 300}
    if kind == "tools":
        return {"messages": [{"role": "system", "content": "You are an order-support agent. Use the tools."},
                             {"role": "user", "content": f"Ticket {seed}-{i}: where is my order #{100_000 + i}?"}],
                "tools": [LOOKUP_ORDER], "tool_choice": "auto", "max_tokens": 300}
    return {"messages": [{"role": "system", "content": "Answer in one short paragraph."},
                         {"role": "user", "content": f"Question {seed}-{i}: summarize note number {i} for the team."}],
            "max_tokens": 256}


def build_tasks(count: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    kinds = ("extraction", "tools", "text")
    return [(kinds[i % 3], task_body(kinds[i % 3], i, seed)) for i in range(count)]


def gateway_policy(sim_port: int, digest: str, escalate: bool) -> dict[str, Any]:
    route: dict[str, Any] = {"chain": ["cheap", "strong"]}
    if escalate:
        route["escalate_when"] = ESCALATE_WHEN
    return {
        "version": 1,
        "upstreams": {"sim": {"kind": "openai", "base_url": f"http://127.0.0.1:{sim_port}/v1"}},
        "models": {name: {"upstream": "sim", "price": dict(price)} for name, price in PRICES.items()},
        # The response cache is off: every task must reach a model.
        "tenants": {"bench": {"api_keys": [digest], "cache": {"enabled": False}}},
        "routes": {"auto": route},
    }


@dataclass
class TaskResult:
    kind: str
    status: int
    cost: Decimal = Decimal(0)
    final_model: str | None = None
    escalations: int = 0
    truth: str | None = None  # correct | check_fail | silent_wrong
    truth_signal: str | None = None
    fails_checks: bool = False  # the final answer fails a configured check (gateway.verify)
    error: str | None = None


@dataclass
class Clients:
    gateway: httpx.AsyncClient
    sim: httpx.AsyncClient
    verifier: Verifier = field(default_factory=Verifier)

    async def ask(self, kind: str, body: dict[str, Any], model: str) -> tuple[TaskResult, dict[str, Any] | None]:
        try:
            reply = await self.gateway.post("/v1/chat/completions", json={**body, "model": model})
        except httpx.HTTPError as exc:
            return TaskResult(kind, 0, error=f"{type(exc).__name__}: {exc}"), None
        cost = Decimal(reply.headers.get("x-gateway-cost-usd") or 0)
        if reply.status_code != 200:
            return TaskResult(kind, reply.status_code, cost, error=reply.text[:300]), None
        response = reply.json()
        final = reply.headers.get("x-gateway-model") or response.get("model")
        escalations = int(reply.headers.get("x-gateway-escalations") or (model == "auto" and final != "cheap"))
        result = TaskResult(kind, 200, cost, final, escalations)
        truth = (await self.sim.get(f"/sim/truth/{response.get('id')}")).json()
        result.truth, result.truth_signal = truth.get("outcome"), truth.get("signal")
        result.fails_checks = bool(self.verifier.check(CHECKS, body, response, {}))
        return result, response

    async def reference(self, kind: str, body: dict[str, Any]) -> TaskResult:
        """What the route should do, done by the client: cheap, check, strong on failure."""
        first, _ = await self.ask(kind, body, "cheap")
        if first.status == 200 and not first.fails_checks:
            return first
        second, _ = await self.ask(kind, body, "strong")
        second.cost += first.cost
        second.escalations = 1
        return second


async def run_all(clients: Clients, tasks: list[tuple[str, dict[str, Any]]], model: str, concurrency: int) -> list[TaskResult]:
    gate = asyncio.Semaphore(concurrency)

    async def one(kind: str, body: dict[str, Any]) -> TaskResult:
        async with gate:
            if model == "cheap>strong":
                return await clients.reference(kind, body)
            return (await clients.ask(kind, body, model))[0]

    return list(await asyncio.gather(*(one(kind, body) for kind, body in tasks)))


def sim_billed_usd(records: list[dict[str, Any]]) -> float:
    total = Decimal(0)
    for r in records:
        price = PRICES.get(r["model"], {"input": 0.0, "output": 0.0})
        total += Decimal(str(r["input_tokens"])) * Decimal(str(price["input"])) + Decimal(str(r["output_tokens"])) * Decimal(str(price["output"]))
    return float(total / Decimal(1_000_000))


def summarize(name: str, model: str, results: list[TaskResult], sim_records: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    done = len(results)
    successes = sum(r.truth == "correct" for r in results)
    cost = sum((r.cost for r in results), Decimal(0))
    by_kind = {kind: round(100 * sum(r.truth == "correct" for r in rs) / len(rs), 2)
               for kind in ("extraction", "tools", "text") if (rs := [r for r in results if r.kind == kind])}
    return {
        "policy": name, "model": model, "tasks": done, "errors": sum(r.status != 200 for r in results),
        "success_pct": round(100 * successes / done, 2) if done else None, "successes": successes,
        "cost_usd": float(cost), "cost_per_success_usd": float(cost / successes) if successes else None,
        "escalation_pct": round(100 * sum(r.escalations > 0 for r in results) / done, 2) if done else None,
        "final_fails_checks": sum(r.fails_checks for r in results),
        "final_silent_wrong": sum(r.truth == "silent_wrong" for r in results),
        "upstream_calls": len(sim_records), "sim_billed_usd": sim_billed_usd(sim_records),
        "success_pct_by_kind": by_kind, "seconds": round(seconds, 2),
        "truths": dict(Counter(f"{r.truth}:{r.truth_signal}" if r.truth_signal else str(r.truth) for r in results)),
        "error_samples": sorted({r.error for r in results if r.error})[:3],
    }


def verdict(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """`name` against always-strong: success within 99 %, cost per success within 40 %."""
    by = {r["policy"]: r for r in rows}
    strong, row = by.get("always-strong"), by.get(name)
    if not strong or not row or not strong["successes"] or not row["successes"]:
        return None
    success_ratio = row["success_pct"] / strong["success_pct"]
    cost_ratio = row["cost_per_success_usd"] / strong["cost_per_success_usd"]
    return {"policy": name, "success_ratio": round(success_ratio, 6), "cost_ratio": round(cost_ratio, 6),
            "met": success_ratio >= TARGET_SUCCESS_RATIO and cost_ratio <= TARGET_COST_RATIO}


class Stack:
    """The simulator and the gateway; every process is stopped by `exits`."""

    def __init__(self, workdir: Path, exits: ExitStack, seed: int) -> None:
        self.workdir, self.exits = workdir, exits
        self.api_key = new_api_key()
        self.sim_port = procs.free_port()
        profiles = [arg for model, rates in PROFILES.items() for arg in ("--quality-profile", f"{model}={rates}")]
        argv = ["sim", "hosted", "--host", "127.0.0.1", "--port", str(self.sim_port), "--seed", str(seed),
                "--model", "cheap", "--model", "strong", "--no-prompt-caching", *profiles]
        self.sim = self._spawn("simulator", argv, dict(os.environ))
        procs.wait_until(self.sim, self.sim_port, "GET", "/v1/models", READY_TIMEOUT_S)
        self.gateway_port = 0
        self.policy_error: str | None = None

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> procs.Spawned:
        proc = procs.Spawned(name, [sys.executable, "-m", "gateway", *argv], env, self.workdir, None)
        self.exits.callback(proc.stop)
        return proc

    def start_gateway(self) -> bool:
        """With `escalate_when`; if the gateway will not start with it, records why and
        starts without it (route `auto` is then a plain chain). True: escalation is on."""
        for escalate in (True, False):
            self.gateway_port = procs.free_port()
            path = self.workdir / f"policy-{'escalate' if escalate else 'plain'}.yaml"
            path.write_text(yaml.safe_dump(gateway_policy(self.sim_port, key_digest(self.api_key), escalate), sort_keys=False))
            env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "GATEWAY_POLICY")}
            env["GATEWAY_VAR_DIR"] = str(self.workdir / f"var-{int(escalate)}")
            argv = ["serve", "--policy", str(path), "--host", "127.0.0.1", "--port", str(self.gateway_port)]
            gateway = self._spawn(f"gateway-{'escalate' if escalate else 'plain'}", argv, env)
            try:
                procs.wait_until(gateway, self.gateway_port, "GET", "/healthz", READY_TIMEOUT_S)
                return escalate
            except (RuntimeError, TimeoutError) as exc:
                if not escalate:
                    raise
                self.policy_error = str(exc)
                gateway.stop()
                print(f"gateway rejected the escalation policy; running without escalate_when:\n{exc}", file=sys.stderr)
        return False


async def measure(stack: Stack, tasks: list[tuple[str, dict[str, Any]]], concurrency: int) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=concurrency * 2)
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.gateway_port}", headers=headers, timeout=60, limits=limits) as gw, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.sim_port}", timeout=30, limits=limits) as sim:
        clients = Clients(gw, sim)
        rows = []
        for name, model in RUNS:
            before = len((await sim.get("/sim/usage")).json()["data"])
            started = time.perf_counter()
            results = await run_all(clients, tasks, model, concurrency)
            elapsed = time.perf_counter() - started
            records = (await sim.get("/sim/usage")).json()["data"][before:]
            rows.append(summarize(name, model, results, records, elapsed))
            row = rows[-1]
            print(f"  {name:24s} success {row['success_pct']}%  cost ${row['cost_usd']:.6f}  escalated {row['escalation_pct']}%"
                  f"  errors {row['errors']}  ({elapsed:.1f} s)", file=sys.stderr, flush=True)
        return rows


COLUMNS = [("policy", "policy"), ("model", "model"), ("tasks", "tasks"), ("errors", "errors"), ("success %", "success_pct"),
           ("cost USD", "cost_usd_s"), ("USD / success", "cost_per_success_s"), ("rel. to strong", "relative_cost_s"),
           ("escalated %", "escalation_pct"), ("upstream calls", "upstream_calls"), ("sim-billed USD", "sim_billed_s"),
           ("final fails checks", "final_fails_checks"), ("final silent wrong", "final_silent_wrong")]


def print_report(report: dict[str, Any]) -> None:
    rows = report["runs"]
    strong = next((r for r in rows if r["policy"] == "always-strong"), None)
    for r in rows:
        r["cost_usd_s"] = f"{r['cost_usd']:.6f}"
        r["sim_billed_s"] = f"{r['sim_billed_usd']:.6f}"
        r["cost_per_success_s"] = f"{r['cost_per_success_usd']:.8f}" if r["cost_per_success_usd"] else None
        if strong and strong["cost_per_success_usd"] and r["cost_per_success_usd"]:
            r["relative_cost_s"] = f"{100 * r['cost_per_success_usd'] / strong['cost_per_success_usd']:.1f} %"
    print(f"\n## Routing: cheap first, escalate on verifiable signals ({report['git']['commit']}, {report['config']['tasks']} tasks)\n")
    print(markdown_table(COLUMNS, rows))
    print("\nSuccess % by task kind: " + "; ".join(f"{r['policy']}: {r['success_pct_by_kind']}" for r in rows))
    gw = report["gateway_policy"]
    if not gw["escalate_when_accepted"]:
        print(f"\nThe gateway REJECTED `escalate_when`; the escalation row ran a plain chain. Error:\n{gw['error']}")
    for v in report["targets"]:
        print(f"\nTarget ({v['policy']}): success {100 * v['success_ratio']:.2f} % of always-strong (>= {100 * TARGET_SUCCESS_RATIO:.0f} %),"
              f" cost per success {100 * v['cost_ratio']:.1f} % of it (<= {100 * TARGET_COST_RATIO:.0f} %): {'MET' if v['met'] else 'NOT MET'}")




def _raise_interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=600, help="distinct tasks, a third of each kind (default 600)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed and prompt salt (default 0)")
    add_output_options(parser, pinning=False)
    args = parser.parse_args(argv)
    if not 3 <= args.tasks <= 100_000 or not 1 <= args.concurrency <= 256:
        parser.error("--tasks within [3, 100000], --concurrency within [1, 256]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    tasks = build_tasks(args.tasks, args.seed)
    report: dict[str, Any] = run_header("routing", {
        "tasks": args.tasks, "concurrency": args.concurrency, "seed": args.seed, "prices_per_1m": PRICES,
        "quality_profiles": PROFILES, "escalate_when": ESCALATE_WHEN, "kinds": dict(Counter(kind for kind, _ in tasks)),
        "target": {"success_ratio_min": TARGET_SUCCESS_RATIO, "cost_ratio_max": TARGET_COST_RATIO}})
    with workspace("gateway-routing-") as workdir, ExitStack() as exits:
        stack = Stack(workdir, exits, args.seed)
        escalating = stack.start_gateway()
        report["gateway_policy"] = {"escalate_when_accepted": escalating, "error": stack.policy_error}
        report["runs"] = asyncio.run(measure(stack, tasks, args.concurrency))
    report["targets"] = [v for name in ("escalation", "reference (client-side)") if (v := verdict(report["runs"], name))]
    print_report(report)
    path = write_json("routing", report, args.out_dir)
    print(f"\nJSON: {path}")
    met = any(v["policy"] == "escalation" and v["met"] for v in report["targets"])
    return 0 if met and escalating and not any(r["errors"] for r in report["runs"]) else 1


if __name__ == "__main__":
    procs.run_script(main)
