"""A raw HTTP/1.1 client for the gateway's server protocol (uvicorn's, bounded), and uvicorn running that
protocol in the test's own event loop: apps wait on events, never on the clock;
GUARD_S only bounds a wait so that a bug fails the test instead of hanging it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from gateway.serving.protocol import BoundedHttpProtocol

GUARD_S = 10
App = Callable[[dict[str, Any], Any, Any], Coroutine[Any, Any, None]]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    chunks: list[bytes] = field(default_factory=list)


@contextlib.asynccontextmanager
async def serving(app: App, **options: Any) -> AsyncIterator[tuple[int, uvicorn.Server]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    options.setdefault("http", BoundedHttpProtocol)
    config = uvicorn.Config(app, lifespan="off", log_level=options.pop("log_level", "critical"), timeout_graceful_shutdown=GUARD_S, **options)
    config.load()
    server = uvicorn.Server(config)
    # Server.serve's steps without its signal handlers, which belong to the test runner.
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    ticking = asyncio.create_task(server.main_loop())  # it renews the date header, and ends on should_exit
    try:
        yield sock.getsockname()[1], server
    finally:
        server.should_exit = True
        async with asyncio.timeout(GUARD_S):
            await ticking
            await server.shutdown(sockets=[sock])
        sock.close()


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    async with asyncio.timeout(GUARD_S):
        head = await reader.readuntil(b"\r\n\r\n")
        line, *fields = head.decode("latin-1").rstrip("\r\n").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)}
        status = int(line.split(" ")[1])
        if "content-length" in headers:
            return Reply(status, headers, await reader.readexactly(int(headers["content-length"])))
        if headers.get("transfer-encoding") == "chunked":
            chunks = []
            while (size := int((await reader.readuntil(b"\r\n")).strip(), 16)) > 0:
                chunks.append(await reader.readexactly(size))
                assert await reader.readexactly(2) == b"\r\n"
            assert await reader.readexactly(2) == b"\r\n"
            return Reply(status, headers, b"".join(chunks), chunks)
        return Reply(status, headers, await reader.read())  # delimited by the close


async def closed(reader: asyncio.StreamReader) -> bool:
    async with asyncio.timeout(GUARD_S):
        return await reader.read() == b""


def post(path: str, body: bytes, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: t", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_all(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers with what it was sent, and where."""
    body = await read_all(receive)
    where = f"{scope['method']} {scope['path']} {scope['raw_path'].decode()} ?{scope['query_string'].decode()}"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body)),
                            (b"x-where", where.encode())]})
    await send({"type": "http.response.body", "body": body})


async def last_reply(app: App, request: bytes) -> Reply:
    """Send `request` on a new connection; its reply, once the server has closed the
    connection after it (a wait bounded by GUARD_S)."""
    async with serving(app) as (port, _):
        reader, writer = await connect(port)
        writer.write(request)
        reply = await read_reply(reader)
        assert await closed(reader), "the server kept the connection open"
        writer.close()
        return reply
