"""What the HTTP server's own Python costs per call: uvicorn's protocol, the gateway's,
and a bare one.

Three servers answer the benchmark's chat request with the same fixed ~1 KB completion
and do nothing else, on the gateway's core (bench/placement.py), driven at c=1 and c=16
from the other in rotating rounds:

- `uvicorn`: a plain ASGI app under `uvicorn.run(loop="uvloop", http="httptools")`,
  access log off.
- `ours`: the same app and options with `http=H1ServerConnection`, the protocol
  `gateway serve` runs (gateway/serving/).
- `bare`: an asyncio protocol on uvloop that feeds the same httptools parser and writes
  the reply from its callback, with nothing in between: no scope, no receive/send
  messages, no task per request. The least any server in Python can cost.

Each minus `bare` is what that server's own Python costs a call. Prints one row per run
and writes bench/out/server-glue-<timestamp>.json.

    .venv/bin/python bench/server_glue.py                       # 3 rounds, 5 s per run
    .venv/bin/python bench/server_glue.py --rounds 1 --duration 2
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httptools
import uvloop

from bench import placement, procs
from bench.gwstack import CHAT_PATH, READY_TIMEOUT_S, workspace
from bench.loadgen import RawClient, Target, closed_loop
from bench.report import add_output_options, args_config, markdown_table, run_header, write_json
from bench.stats import summarize
from bench.workload import chat_body

SERVERS = ("uvicorn", "ours", "bare")
COMPLETION = (b'{"id":"chatcmpl-0","object":"chat.completion","created":0,"model":"bench-model","choices":[{"index":0,'
              b'"message":{"role":"assistant","content":"' + b"word " * 180 + b'"},"finish_reason":"stop"}],'
              b'"usage":{"prompt_tokens":1023,"completion_tokens":20,"total_tokens":1043}}')
REPLY_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(COMPLETION)


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await receive()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(COMPLETION)).encode())]})
    await send({"type": "http.response.body", "body": COMPLETION})


class BareProtocol(asyncio.Protocol):
    """Keep-alive HTTP/1.1 for this benchmark's clients: each complete request gets the
    fixed reply, written from the parser's callback."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.transport.write(REPLY_HEAD + COMPLETION)


def serve(server: str, port: int) -> None:
    if server in ("uvicorn", "ours"):
        import uvicorn

        from gateway.serving.h1_connection import H1ServerConnection

        uvicorn.run(asgi_app, host="127.0.0.1", port=port, loop="uvloop", access_log=False, log_level="warning",
                    http=H1ServerConnection if server == "ours" else "httptools")
        return

    async def bare() -> None:
        listening = await asyncio.get_running_loop().create_server(BareProtocol, "127.0.0.1", port)
        await listening.serve_forever()

    uvloop.run(bare())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every server, rotating (default 3)")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each run (default 1)")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated closed-loop concurrencies (default 1,16)")
    add_output_options(parser, pinning=True)
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)  # the child: run one server
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not 1 <= args.rounds <= 50 or args.duration <= 0 or args.warmup < 0 or not args.concurrency \
            or any(c < 1 for c in args.concurrency):
        parser.error("--rounds from 1 to 50, --duration above 0, --warmup 0 or more, concurrencies of 1 or more")
    return args


async def measure(proc: procs.Spawned, target: Target, concurrency: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    client = RawClient(concurrency)
    try:
        if warmup_s:
            await closed_loop(client, target, concurrency, warmup_s, 10**9)
        cpu_before = procs.cpu_seconds(proc.pid)
        samples = await closed_loop(client, target, concurrency, duration_s, 10**9)
        cpu_s = procs.cpu_seconds(proc.pid) - cpu_before
    finally:
        await client.aclose()
    summary = summarize(samples)
    summary["server_cpu_us_per_req"] = round(cpu_s / samples.completed * 1e6, 1) if samples.completed else None
    return summary


def run(args: argparse.Namespace) -> int:
    place = placement.from_args(args)
    placement.join_load_core(place)
    body = chat_body(False)
    rows: list[dict[str, Any]] = []
    with workspace("server-glue-") as workdir, ExitStack() as exits:
        servers = {}
        for server in SERVERS:
            port = procs.free_port()
            proc = procs.Spawned(server, [sys.executable, str(Path(__file__).resolve()), "--serve", server, "--port", str(port)],
                                 dict(os.environ), workdir, placement.gateway_core(place))
            exits.callback(proc.stop)
            procs.wait_until(proc, port, "POST", CHAT_PATH, READY_TIMEOUT_S, body, {"Content-Type": "application/json"})
            servers[server] = (proc, Target(server, port, CHAT_PATH, "unused", False, body))
        for round_no in range(1, args.rounds + 1):
            shift = round_no % len(SERVERS)
            order = SERVERS[shift:] + SERVERS[:shift]
            for concurrency in args.concurrency:
                for server in order:
                    proc, target = servers[server]
                    result = asyncio.run(measure(proc, target, concurrency, args.warmup, args.duration))
                    rows.append({"round": round_no, "server": server, "concurrency": concurrency, **result})
                    print(markdown_table(COLUMNS, [rows[-1]]).splitlines()[-1], flush=True)
    summary = [_difference(rows, c, server) for c in args.concurrency for server in SERVERS if server != "bare"]
    print("\n" + markdown_table(COLUMNS, rows) + "\n\n" + markdown_table(SUMMARY_COLUMNS, summary))
    report = run_header("server_glue", args_config(args)) | {"pinning": placement.report(place), "runs": rows, "summary": summary}
    print(f"\nJSON: {write_json('server-glue', report, args.out_dir)}")
    return 1 if any(row["errors"] for row in rows) else 0


def _difference(rows: list[dict[str, Any]], concurrency: int, server: str) -> dict[str, Any]:
    """`server` minus bare at one concurrency, from the medians over rounds."""
    def median(name: str, key: str) -> float:
        values = [r[key] for r in rows if r["server"] == name and r["concurrency"] == concurrency and r["completed"]]
        return statistics.median(values) if values else math.nan

    return {"concurrency": concurrency, "server": server,
            "p50_ms": round(median(server, "p50_ms") - median("bare", "p50_ms"), 3),
            "cpu_us": round(median(server, "server_cpu_us_per_req") - median("bare", "server_cpu_us_per_req"), 1),
            "rps_ratio": round(median(server, "rps") / median("bare", "rps"), 3)}


COLUMNS = [("round", "round"), ("server", "server"), ("conc", "concurrency"), ("req/s", "rps"), ("p50 ms", "p50_ms"),
           ("p90 ms", "p90_ms"), ("p99 ms", "p99_ms"), ("server CPU us/req", "server_cpu_us_per_req"), ("errors", "errors")]
SUMMARY_COLUMNS = [("conc", "concurrency"), ("server", "server"), ("minus bare: p50 ms (medians of rounds)", "p50_ms"),
                   ("CPU us/req", "cpu_us"), ("req/s over bare's", "rps_ratio")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.port)
        return 0
    return run(args)


if __name__ == "__main__":
    procs.run_script(main)
