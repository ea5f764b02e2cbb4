"""Minimal raw-ASGI plumbing shared by the simulators.

The simulators are the zero-latency upstream in overhead benchmarks, so they skip any
framework: one async callable reads the body, dispatches on the path and writes the
response with as few ASGI sends as the protocol allows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON_TYPE = (b"content-type", b"application/json")
SSE_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")


class ASGIApp(Protocol):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...


@dataclass
class HttpRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """Parse the body; raises ValueError (orjson.JSONDecodeError) when it is not JSON."""
        return orjson.loads(self.body)

    def query_one(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


async def read_request(scope: Scope, receive: Receive) -> HttpRequest:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    raw_query = scope.get("query_string", b"").decode("latin-1")
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
    return HttpRequest(
        method=scope["method"],
        path=scope["path"],
        query=parse_qs(raw_query, keep_blank_values=True) if raw_query else {},
        headers=headers,
        body=b"".join(chunks),
    )


async def send_bytes(send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    all_headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, payload: Any, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await send_bytes(send, status, orjson.dumps(payload), [JSON_TYPE, *headers])


def sse_event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


async def start_sse(send: Send, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [SSE_TYPE, *headers]})


async def send_sse_chunk(send: Send, data: bytes) -> None:
    # One ASGI send per event so every chunk leaves the server when it is produced.
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def end_body(send: Send) -> None:
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def handle_lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class DisconnectWatch:
    """Notices a client disconnect while the app is still producing the response.

    After the body is read, uvicorn's `receive()` only returns once the client goes away
    (or the response completes), so one background task waiting on it is enough.
    """

    def __init__(self, receive: Receive) -> None:
        self._gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self._gone.done():
                    self._gone.set_result(None)
                return

    @property
    def disconnected(self) -> bool:
        return self._gone.done()

    @property
    def future(self) -> asyncio.Future[None]:
        return self._gone

    async def sleep(self, delay: float) -> bool:
        """Sleep up to `delay` seconds; True if the client disconnected meanwhile."""
        if delay > 0 and not self._gone.done():
            await asyncio.wait((self._gone,), timeout=delay)
        else:
            await asyncio.sleep(0)  # let the watcher task observe a pending disconnect
        return self._gone.done()

    def close(self) -> None:
        self._task.cancel()


class StreamCut(Exception):
    """Raised inside an app to drop the connection mid-response, like a failing provider."""


class _HideStreamCuts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamCut))


def cut_connection() -> StreamCut:
    """Return the exception that makes uvicorn close the socket without ending the body.

    The deliberate cut is not an application error, so uvicorn's error log is told to
    skip it (idempotent: the filter is added once per process).
    """
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _HideStreamCuts) for f in logger.filters):
        logger.addFilter(_HideStreamCuts())
    return StreamCut("simulated connection cut")


Handler = Callable[[HttpRequest, Receive, Send], Awaitable[None]]


class RoutedApp:
    """An ASGI app dispatching on (method, path) to `_routes`; `unrouted` answers the rest."""

    _routes: dict[tuple[str, str], Handler]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await handle_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        request = await read_request(scope, receive)
        handler = self._routes.get((request.method, request.path))
        if handler is None:
            await self.unrouted(request, receive, send)
            return
        await handler(request, receive, send)

    async def unrouted(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        await send_json(send, 404, {"detail": "Not Found"})


@dataclass
class RequestStats:
    """What both simulators count for tests: requests, answers by status, aborts, and
    the last request as it arrived (to check what a gateway forwarded)."""

    requests: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    aborted: int = 0  # the client went away before the response finished
    last_authorization: str | None = None
    last_body: Any = None
    last_headers: dict[str, str] = field(default_factory=dict)

    def count_status(self, status: int) -> None:
        key = str(status)
        self.by_status[key] = self.by_status.get(key, 0) + 1
