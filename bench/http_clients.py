"""Which HTTP client should carry upstream traffic? CPU per request of httpx, httpcore
(httpx's transport, used directly), aiohttp and our own HTTP/1.1 pool (gateway/upstreams/h1.py)
against the hosted simulator, one process, closed loop. Run: .venv/bin/python bench/http_clients.py [--requests N]"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import httpcore
import httpx
import orjson

from bench.procs import free_port, http_status
from gateway.upstreams.h1 import H1Pool

BODY = orjson.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "hello " * 900}], "max_tokens": 20})
HEADERS: dict[bytes | str, bytes | str] = {"content-type": "application/json"}


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(name: str, send: Callable[[], Awaitable[int]], requests: int, concurrency: int) -> dict[str, float]:
    for _ in range(50):  # warm the pool
        await send()
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            assert await send() == 200

    start_cpu, start = cpu_s(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    wall, cpu = time.perf_counter() - start, cpu_s() - start_cpu
    return {"client": name, "req_per_s": requests / wall, "client_cpu_ms_per_req": 1000 * cpu / requests}  # type: ignore[dict-item]


async def run(url: str, requests: int, concurrency: int) -> list[dict[str, float]]:
    results = []
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
        async def via_httpx() -> int:
            return (await client.post(url, content=BODY, headers={"content-type": "application/json"})).status_code
        results.append(await measure("httpx", via_httpx, requests, concurrency))
    async with httpcore.AsyncConnectionPool(max_connections=64) as pool:
        async def via_httpcore() -> int:
            response = await pool.request("POST", url, content=BODY, headers=HEADERS)
            return response.status
        results.append(await measure("httpcore", via_httpcore, requests, concurrency))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        async def via_aiohttp() -> int:
            async with session.post(url, data=BODY, headers={"content-type": "application/json"}) as response:
                await response.read()
                return response.status
        results.append(await measure("aiohttp", via_aiohttp, requests, concurrency))
    base, _, path = url.partition("/v1")
    pool = H1Pool(base + "/v1", default_headers={"content-type": "application/json"}, max_connections=64,
                  keepalive_s=30.0, connect_timeout_s=5.0)
    path = path or "/"

    async def via_h1() -> int:
        # Both bounds set, as the gateway sets them on every non-streaming call.
        response = await pool.request("POST", path, BODY, timeout_s=60.0, read_timeout_s=60.0)
        await response.read()
        return response.status
    results.append(await measure("h1 (gateway/upstreams/h1.py)", via_h1, requests, concurrency))
    await pool.aclose()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    port = free_port()
    sim = subprocess.Popen([sys.executable, "-m", "gateway", "sim", "hosted", "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while http_status(port, "GET", "/v1/models", None, None) != 200:
            if time.monotonic() > deadline:
                raise TimeoutError("the simulator did not start")
            time.sleep(0.05)
        import uvloop

        results = uvloop.run(run(f"http://127.0.0.1:{port}/v1/chat/completions", args.requests, args.concurrency))
    finally:
        sim.terminate()
        sim.wait(10)
    print("| client | req/s | client CPU ms/req |\n|---|---|---|")
    for r in results:
        print(f"| {r['client']} | {r['req_per_s']:.0f} | {r['client_cpu_ms_per_req']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
