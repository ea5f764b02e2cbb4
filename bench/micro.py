"""What two pieces of every call's bookkeeping cost, timed hot in this process.

- `record`: `record_request`, the Prometheus observations of one answered call (a
  non-streamed one, and a stream with its time to first token and per-token time).
- `bind`: the ledger writer's binding of one call's five statements (hold, reservation,
  its end, the spend, the usage event) into the driver's parameters - the part of the
  writer thread that holds the GIL - against a cursor that runs nothing.

Each figure is the best of `--repeat` timings of `--number` calls. Run it from another
checkout with `--tree` to compare two versions in one run:

    .venv/bin/python bench/micro.py
    git worktree add /tmp/before <rev> && .venv/bin/python bench/micro.py --tree /tmp/before --tree .
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def measure(number: int, repeat: int) -> dict[str, float]:
    from datetime import UTC, datetime, timedelta

    from gateway.accounting import ledger
    from gateway.accounting.driver_sql import DriverSql
    from gateway.pipeline.observe import record_request
    from gateway.request_context import Attempt, RequestContext
    from gateway.routing.resolved import ModelTarget
    from gateway.telemetry.metrics import Metrics
    from gateway.telemetry.timeline import Timeline
    from gateway.types.cache import CachePlan
    from gateway.types.usage import Usage

    def best(fn: Any) -> float:
        return round(min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6, 2)

    metrics = Metrics()
    target = ModelTarget("bench-model", "local", "openai", "bench-model", None, "o200k_base", 4096)

    def answered(stream: bool) -> RequestContext:
        ctx = RequestContext(request_id="req_1", endpoint="chat.completions", path="/chat/completions", policy=None)  # type: ignore[arg-type]
        ctx.tenant, ctx.cache, ctx.targets = "acme", CachePlan("bypass"), [target]
        start = ctx.timeline.enqueue
        ctx.timeline.end = start + 0.0006
        timeline = Timeline(upstream_start=start + 0.0001, end=start + 0.0005)
        if stream:
            timeline.first_token = ctx.timeline.first_token = start + 0.0002
            timeline.last_token = start + 0.0004
        ctx.attempts = [Attempt(target, timeline, status="ok", usage=Usage(prompt_tokens=1023, completion_tokens=20))]
        return ctx

    plain, streamed = answered(False), answered(True)

    class NoDatabase:  # the driver's side costs nothing: what is left is the binding
        rowcount = 1

        def execute(self, sql: str, params: Any) -> None: ...

        def executemany(self, sql: str, rows: Any) -> None: ...

        def fetchone(self) -> tuple[int]:
            return (1,)

    sql = DriverSql(NoDatabase(), pyformat=False, sqlite=True, returning=True)  # type: ignore[arg-type]
    now = datetime.now(UTC)
    reservation = dict(
        id="rsv_x_0", request_id="req_x", tenant="acme", key_id="key_1", task_id=None, model="bench-model",
        upstream_model="bench-model", upstream="local", endpoint="chat.completions", budget_ids="tenant:acme:month:",
        amount_pico=5_000_000, tokens=1_300, prompt_tokens_est=1_023, state="reserved", created_at=now,
        expires_at=now + timedelta(seconds=330), settled_pico=None, ended_at=None)
    ending = {"state": "settled", "charged": 4_000, "now": now, "id": "rsv_x_0", "amount": 5_000_000, "tokens": 1_300,
              "used": 1_043, "drawn_by": None, "unused": 0}
    event = {**ledger.EVENT_DEFAULTS, "request_id": "req_x", "attempt": 1, "reservation_id": "rsv_x_0", "tenant": "acme",
             "key_id": "key_1", "endpoint": "chat.completions", "model": "bench-model", "upstream_model": "bench-model",
             "upstream": "local", "status": "ok", "http_status": 200, "usage_known": True, "prompt_tokens": 1_023,
             "completion_tokens": 20, "cost_pico": 4_000, "created_at": now, "day": now.date().isoformat(),
             "timeline": '{"enqueue": 0.0, "end": 0.6}'}

    def bind() -> None:
        sql.fetchone(ledger.HOLD_RETURNING, {"id": "tenant:acme:month:", "amount": 5_000_000, "tokens": 1_300,
                                              "limit": None, "margin": 0})
        sql.execute(ledger.INSERT_RESERVATION, reservation)
        sql.execute(ledger.END_RESERVATION, ending)
        sql.execute(ledger.MOVE_TO_SPENT, {**ending, "id": "tenant:acme:month:"})
        sql.executemany(ledger.INSERT_EVENT, [event])

    return {"record_request_us": best(lambda: record_request(metrics, plain)),
            "record_request_stream_us": best(lambda: record_request(metrics, streamed)),
            "bind_call_statements_us": best(bind)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=50_000, help="calls per timing (default 50000)")
    parser.add_argument("--repeat", type=int, default=5, help="timings per figure; the best is kept (default 5)")
    parser.add_argument("--tree", action="append", type=Path, help="a checkout to measure (repeatable; default: this one)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one tree's figures, for --tree
    args = parser.parse_args(argv)
    if args.json:
        sys.path.insert(0, str(Path.cwd()))
        print(json.dumps(measure(args.number, args.repeat)))
        return 0
    for tree in args.tree or [ROOT]:
        out = subprocess.run([sys.executable, "-P", str(Path(__file__).resolve()), "--json", "--number", str(args.number),
                              "--repeat", str(args.repeat)], cwd=tree, check=True, capture_output=True, text=True).stdout
        figures = json.loads(out)
        print(f"{tree}: " + ", ".join(f"{name} {value}" for name, value in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
