"""A lean HTTP/1.1 client for upstream model traffic: one connection pool per origin.

Built for exactly what the gateway sends - a POST of a JSON body to a handful of paths
on one origin, a content-length, chunked or read-until-close response, sometimes
streamed - so the request head is encoded once per path and each request is a single
write. The wire protocol is in `h1_protocol.py`. Nothing here retries a request that
was written: POST is not idempotent, and the retry module decides."""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from urllib.parse import urlsplit

from gateway.upstreams.h1_protocol import (
    H1ConnectError,
    H1Connection,
    H1ConnectTimeout,
    H1DeadlinePassed,
    H1Disconnected,
    H1Error,
    H1ProtocolError,
    H1Timeout,
)

__all__ = ["H1ConnectError", "H1ConnectTimeout", "H1DeadlinePassed", "H1Disconnected", "H1Error", "H1Pool",
           "H1ProtocolError", "H1Response", "H1Timeout"]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_UNSUPPORTED_METHODS = frozenset({"HEAD", "CONNECT"})  # their responses do not follow the body rules
_BODYLESS_METHODS = frozenset({"GET", "DELETE", "OPTIONS", "TRACE"})
_FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding"})
_MAX_CACHED_HEADS = 256
_CLOSE_WAIT_S = 1.0

# A waiter is handed either an idle connection or a reserved slot (None) to connect with.
_Turn = H1Connection | None


class H1Response:
    """Status and headers of a response; the body is read with `read` or `iter_raw`.

    Reading the body to the end hands the connection back to the pool. Otherwise end it
    with `release()` (reuses the connection only if the body was complete) or `close()`
    (drops it - how a streaming server learns to abort). `async with` does `release()`."""

    __slots__ = ("_conn", "_eof", "_pool", "headers", "status")

    def __init__(self, pool: H1Pool, conn: H1Connection) -> None:
        self.status: int = conn.status
        self.headers: dict[str, str] = conn.headers
        self._pool = pool
        self._conn: H1Connection | None = conn
        self._eof = False

    @property
    def at_eof(self) -> bool:
        """The whole body has been received and handed to the caller."""
        return self._eof

    async def read(self) -> bytes:
        conn = self._conn
        if conn is None:
            if self._eof:
                return b""
            raise H1Error("the response was already closed")
        try:
            while not conn.complete:
                if conn.error is not None:
                    raise conn.error
                await conn.wait()
        except BaseException:
            self.close()
            raise
        body = conn.take()
        self._eof = True
        self.release()
        return body

    async def iter_raw(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (chunked framing removed), in pieces of any size."""
        while (conn := self._conn) is not None:
            if conn.has_data():
                yield conn.take()
            elif conn.complete:
                self._eof = True
                self.release()
            elif conn.error is not None:
                error = conn.error
                self.close()
                raise error
            else:
                try:
                    await conn.wait()
                except BaseException:
                    self.close()
                    raise

    def release(self) -> None:
        conn = self._conn
        if conn is not None:
            self._conn = None
            self._pool._release(conn)

    def close(self) -> None:
        conn = self._conn
        if conn is not None:
            self._conn = None
            self._pool._discard(conn)

    async def __aenter__(self) -> H1Response:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()


class H1Pool:
    """Keep-alive HTTP/1.1 connections to one origin (scheme, host, port).

    At most `max_connections` are open; further requests wait first in, first out.
    Idle connections are reused last in, first out, and closed once idle longer than
    `keepalive_s`. Use from one event loop; `aclose()` closes every connection."""

    def __init__(self, url: str, *, default_headers: Mapping[str, str], max_connections: int, keepalive_s: float,
                 connect_timeout_s: float, ssl_context: ssl.SSLContext | None = None) -> None:
        if max_connections < 1 or keepalive_s < 0 or connect_timeout_s <= 0:
            raise ValueError("max_connections must be >= 1, keepalive_s >= 0 and connect_timeout_s > 0")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) base URL: {url!r}")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("the base URL may not carry a query, a fragment or credentials")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._base_path = parts.path.rstrip("/")
        self._ssl_context = ssl_context
        self._max = max_connections
        self._keepalive_s = keepalive_s
        self._connect_timeout_s = connect_timeout_s
        self._fixed_headers = self._encode_fixed_headers(default_headers)
        self._heads: dict[tuple[str, str], bytes] = {}
        self._idle: deque[H1Connection] = deque()  # oldest idle first; reuse from the right
        self._conns: set[H1Connection] = set()
        self._waiters: deque[asyncio.Future[_Turn]] = deque()
        self._open = 0  # connections open or being opened, including slots handed to waiters
        self._closed = False

    def _encode_fixed_headers(self, default_headers: Mapping[str, str]) -> bytes:
        headers = {name.lower(): value for name, value in default_headers.items()}
        for name, value in headers.items():
            if not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\0"):
                raise ValueError(f"invalid header {name!r}")
            if name in _FRAMING_HEADERS:
                raise ValueError(f"the client sets {name} itself")
        host = f"[{self._host}]" if ":" in self._host else self._host
        if self._port != (443 if self._tls else 80):
            host = f"{host}:{self._port}"
        headers = {"host": host, "accept-encoding": "identity", **headers}  # no decoder here: ask for none
        return "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode("latin-1")

    def _head(self, method: str, path: str) -> bytes:
        """The request line and every header but content-length, encoded once per path."""
        head = self._heads.get((method, path))
        if head is not None:
            return head
        if not _TOKEN.fullmatch(method) or method in _UNSUPPORTED_METHODS:
            raise ValueError(f"unsupported method {method!r}")
        if not path.startswith("/") or not path.isascii() or not path.isprintable() or " " in path:
            raise ValueError(f"invalid request path {path!r}")
        head = f"{method} {self._base_path}{path} HTTP/1.1\r\n".encode("ascii") + self._fixed_headers
        if len(self._heads) < _MAX_CACHED_HEADS:
            self._heads[(method, path)] = head
        return head

    async def request(self, method: str, path: str, body: bytes, *, timeout_s: float | None = None,
                      read_timeout_s: float | None = None) -> H1Response:
        """Send one request on `base URL + path`; return once the status and headers arrive.

        `timeout_s` bounds everything up to the last body byte (waiting for a slot,
        connecting, headers, body); `read_timeout_s` bounds each gap between received
        bytes, the wait for the first one included. Connecting is also bounded by the
        pool's `connect_timeout_s`."""
        if self._closed:
            raise H1Error("the connection pool is closed")
        head = self._head(method, path)
        if body or method not in _BODYLESS_METHODS:
            data = b"%bcontent-length: %d\r\n\r\n%b" % (head, len(body), body)
        else:
            data = head + b"\r\n"
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = None if timeout_s is None else now + timeout_s
        conn = self._pop_idle(now)
        if conn is None:
            conn = await self._acquire(loop, deadline)
            now = loop.time()
        try:
            conn.send(data, now, deadline, timeout_s, read_timeout_s)
            while not conn.headers_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait()
        except BaseException:
            self._discard(conn)
            raise
        return H1Response(self, conn)

    async def aclose(self) -> None:
        """Close every connection; requests waiting for one get an H1Error."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(H1Error("the connection pool was closed"))
        self._open -= len(self._idle)  # busy connections give their slot back on release/close
        self._idle.clear()
        conns, self._conns = self._conns, set()
        gone = []
        for conn in conns:
            future = conn.gone_future()
            conn.abort()
            if future is not None:
                gone.append(future)
        if gone:
            await asyncio.wait(gone, timeout=_CLOSE_WAIT_S)

    # -- connections ---------------------------------------------------------------------

    def _pop_idle(self, now: float) -> H1Connection | None:
        idle = self._idle
        if not idle:
            return None
        expired_before = now - self._keepalive_s
        while idle and idle[0].idle_since <= expired_before:
            self._drop(idle.popleft())
        while idle:
            conn = idle.pop()
            if conn.usable_when_idle(now):
                return conn
            self._drop(conn)
        return None

    async def _acquire(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> H1Connection:
        if self._open < self._max and not self._waiters:
            self._open += 1
            return await self._connect(loop, deadline)
        turn = await self._wait_for_turn(loop, deadline)
        if turn is not None:
            if turn.is_open():  # released moments ago: no need to probe it
                return turn
            self._conns.discard(turn)  # closed while handed over: connect in its slot
            turn.abort()
        return await self._connect(loop, deadline)

    async def _wait_for_turn(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> _Turn:
        waiter: asyncio.Future[_Turn] = loop.create_future()
        self._waiters.append(waiter)
        timer = None if deadline is None else loop.call_at(deadline, self._expire_waiter, waiter)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._pass_on(waiter.result())  # handed a turn just as we were cancelled
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    @staticmethod
    def _expire_waiter(waiter: asyncio.Future[_Turn]) -> None:
        if not waiter.done():
            waiter.set_exception(H1Timeout("no free connection in the pool before the deadline"))

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> H1Connection:
        """Open a connection in a slot already counted in `_open`; give the slot back on failure."""
        timeout = self._connect_timeout_s if deadline is None else min(self._connect_timeout_s, deadline - loop.time())
        conn = H1Connection(loop)
        try:
            tls = self._tls_context() if self._tls else None
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: conn, self._host, self._port, ssl=tls,
                                             server_hostname=self._host if tls is not None else None)
        except BaseException as exc:
            conn.abort()  # in case the transport was made just as the connect was abandoned
            self._slot_freed()
            where = f"{self._host}:{self._port}"
            if isinstance(exc, TimeoutError):
                raise H1ConnectTimeout(f"could not connect to {where} within {timeout:.3g}s") from None
            if isinstance(exc, OSError):
                raise H1ConnectError(f"could not connect to {where}: {type(exc).__name__}: {exc}") from exc
            raise
        if self._closed:
            conn.abort()
            self._slot_freed()
            raise H1Error("the connection pool was closed")
        self._conns.add(conn)
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
            self._ssl_context = context
        return self._ssl_context

    def _release(self, conn: H1Connection) -> None:
        conn.end_exchange()
        if self._closed or not conn.reusable():
            self._discard(conn)
            return
        waiter = self._next_waiter()
        if waiter is not None:
            waiter.set_result(conn)
        else:
            conn.idle_since = conn.loop_time()
            self._idle.append(conn)

    def _pass_on(self, turn: _Turn) -> None:
        if turn is None:
            self._slot_freed()
        else:
            self._release(turn)

    def _discard(self, conn: H1Connection) -> None:
        conn.end_exchange()
        conn.abort()
        if conn in self._conns:
            self._conns.discard(conn)
            self._slot_freed()

    def _drop(self, conn: H1Connection) -> None:
        """Close an idle connection; its slot is free again (no one waits while some are idle)."""
        conn.abort()
        self._conns.discard(conn)
        self._open -= 1

    def _slot_freed(self) -> None:
        waiter = self._next_waiter()
        if waiter is not None:
            waiter.set_result(None)  # the slot passes straight to the first waiter
        else:
            self._open -= 1

    def _next_waiter(self) -> asyncio.Future[_Turn] | None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                return waiter
        return None
