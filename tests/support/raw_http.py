"""A scriptable HTTP/1.1 server on a real loopback socket, in the test's own event loop,
for client tests that must control every byte: chunk timing, stalls, garbage, closes.

The handler gets each parsed request and the connection's writer and writes whatever
response it likes; it returns False to stop serving that connection. The server counts
connections (in total and at once) and lets a test await a connection's end."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType


@dataclass(slots=True)
class Received:
    connection: int  # 0 for the first connection the server accepted, 1 for the next...
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[Received, asyncio.StreamWriter], Awaitable[bool]]


def response(status: int = 200, body: bytes = b"", headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A content-length response, as bytes."""
    lines = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


class RawHttpServer:
    def __init__(self, handler: Handler, *, tls: ssl.SSLContext | None = None) -> None:
        self._handler = handler
        self._tls = tls
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ended: dict[int, asyncio.Event] = {}
        self._accepted = 0
        self.requests: list[Received] = []
        self._arrived = asyncio.Event()  # set and replaced on every request
        self.open_now = 0
        self.max_open = 0

    @property
    def connections(self) -> int:
        return self._accepted

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{port}"

    async def connection_ended(self, connection: int) -> None:
        """Until the server has seen that connection end (the client closed it, or the handler did)."""
        async with asyncio.timeout(10):  # a hang guard, not a timing assumption
            await self._ended_event(connection).wait()

    async def requests_received(self, count: int) -> None:
        """Until at least `count` requests have arrived."""
        async with asyncio.timeout(10):  # a hang guard, not a timing assumption
            while len(self.requests) < count:
                await self._arrived.wait()

    def _ended_event(self, connection: int) -> asyncio.Event:
        return self._ended.setdefault(connection, asyncio.Event())

    async def __aenter__(self) -> RawHttpServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._tls)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        connection = self._accepted
        self._accepted += 1
        ended = self._ended_event(connection)
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        try:
            while (request := await self._read_request(connection, reader)) is not None:
                self.requests.append(request)
                self._arrived.set()
                self._arrived = asyncio.Event()
                if not await self._handler(request, writer):
                    break
        finally:
            self.open_now -= 1
            writer.transport.abort()
            ended.set()
            self._tasks.discard(task)

    @staticmethod
    async def _read_request(connection: int, reader: asyncio.StreamReader) -> Received | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            return None  # the client closed the connection
        line, *fields = head.decode("latin-1").split("\r\n")
        method, target, _ = line.split(" ", 2)
        headers: dict[str, str] = {}
        for field in fields:
            if field:
                name, _, value = field.partition(":")
                headers[name.strip().lower()] = value.strip()
        try:
            body = await reader.readexactly(int(headers.get("content-length", "0")))
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            return None
        return Received(connection, method, target, headers, body)
