"""Closed-loop load: `concurrency` workers, each sending its next request as soon as the
previous one has been read to the end, until the run's time or request cap is reached.

Two interchangeable clients: `raw` (bench.http1, prebuilt request bytes; the default,
because its cost per request is a fraction of httpx's) and `httpx` (httpx.AsyncClient
with a pool of `concurrency` connections), so the client's own share can be checked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httpx
import orjson

from bench.http1 import Http1Connection, OnChunk, build_request
from bench.stats import RunSamples

REQUEST_TIMEOUT_S = 30.0
ERROR_PAUSE_S = 0.01  # keeps a failing target from turning a worker into a busy loop


@dataclass(frozen=True)
class Target:
    name: str  # "direct" or "gateway"
    port: int
    path: str
    api_key: str
    stream: bool
    body: bytes
    extra_headers: tuple[tuple[str, str], ...] = ()  # sent after the standard ones (a tuple: Target stays hashable)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def headers(self) -> dict[str, str]:
        accept = "text/event-stream" if self.stream else "application/json"
        headers = {"Content-Type": "application/json", "Accept": accept, "Authorization": f"Bearer {self.api_key}"}
        headers.update(self.extra_headers)
        return headers


STREAM_ENDS = (b"event: response.completed", b"event: response.incomplete", b"event: message_stop")


class StreamCheck:
    """Watches an SSE body: when the first non-empty content delta arrived, and whether
    the stream ended with `data: [DONE]`. Stops parsing after the first content."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._buffer = b""
        self._tail = b""
        self.first_content_at: float | None = None
        self._completed = False

    def feed(self, chunk: bytes) -> None:
        # A Responses-API stream ends with `response.completed` (or `.incomplete`, at the
        # output bound), a Messages-API stream with `message_stop`, neither with [DONE].
        seen = self._tail + chunk
        self._completed = self._completed or any(end in seen for end in STREAM_ENDS)
        self._tail = (self._tail + chunk)[-64:]
        if self.first_content_at is not None:
            return
        self._buffer += chunk.replace(b"\r\n", b"\n")
        *events, self._buffer = self._buffer.split(b"\n\n")
        for event in events:
            if _has_content(event):
                self.first_content_at = self._clock()
                self._buffer = b""
                return

    @property
    def done(self) -> bool:
        return self._completed or b"data: [DONE]" in self._tail


def _has_content(event: bytes) -> bool:
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return False
        try:
            payload = orjson.loads(data)
            choices = payload.get("choices") or []
        except (orjson.JSONDecodeError, AttributeError):
            return False
        if payload.get("type") == "response.output_text.delta" and payload.get("delta"):
            return True
        if payload.get("type") == "content_block_delta" and (payload.get("delta") or {}).get("text"):
            return True
        if choices and (choices[0].get("delta") or {}).get("content"):
            return True
    return False


class Client(Protocol):
    async def send(self, target: Target, on_chunk: OnChunk) -> int: ...

    async def aclose(self) -> None: ...


class RawClient:
    """One Http1Connection per worker; request bytes built once per target."""

    def __init__(self, concurrency: int) -> None:
        self._idle: list[Http1Connection] = []
        self._prebuilt: dict[Target, bytes] = {}

    async def send(self, target: Target, on_chunk: OnChunk) -> int:
        raw = self._prebuilt.get(target)
        if raw is None:
            raw = self._prebuilt[target] = build_request("127.0.0.1", target.port, target.path, target.body, target.headers())
        conn = self._idle.pop() if self._idle else Http1Connection("127.0.0.1", target.port)
        try:
            return await conn.request(raw, on_chunk)
        finally:
            self._idle.append(conn)

    async def aclose(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


class HttpxClient:
    def __init__(self, concurrency: int) -> None:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._client = httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT_S, trust_env=False)

    async def send(self, target: Target, on_chunk: OnChunk) -> int:
        async with self._client.stream("POST", target.url, content=target.body, headers=target.headers()) as response:
            async for chunk in response.aiter_raw():
                on_chunk(chunk)
            return response.status_code

    async def aclose(self) -> None:
        await self._client.aclose()


CLIENTS: dict[str, Callable[[int], Client]] = {"raw": RawClient, "httpx": HttpxClient}


async def one_request(client: Client, target: Target, samples: RunSamples) -> None:
    check = StreamCheck()
    start = time.perf_counter()
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            status = await client.send(target, check.feed)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, httpx.HTTPError, ValueError) as exc:
        samples.add_error(type(exc).__name__)
        await asyncio.sleep(ERROR_PAUSE_S)
        return
    end = time.perf_counter()
    if status != 200:
        samples.add_error(f"http_{status}")
    elif target.stream and not (check.done and check.first_content_at is not None):
        samples.add_error("stream_incomplete")
    else:
        samples.latencies_s.append(end - start)
        if target.stream and check.first_content_at is not None:
            samples.ttfts_s.append(check.first_content_at - start)


async def closed_loop(client: Client, target: Target, concurrency: int, seconds: float, max_requests: int) -> RunSamples:
    """Run until `seconds` have passed or `max_requests` were started; requests in
    flight at the deadline are finished and counted, elapsed time includes them."""
    samples = RunSamples()
    started = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal started
        while time.perf_counter() < deadline and started < max_requests:
            started += 1
            await one_request(client, target, samples)

    begin = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    samples.elapsed_s = time.perf_counter() - begin
    return samples
