"""One HTTP/1.1 client connection on the wire: an `asyncio.Protocol` that writes a
request, parses the response with httptools and buffers the body for one consumer.

It owns flow control (pause reading while the consumer is behind), the single timer
that enforces both the request deadline and the read-gap timeout, and the error types.
Pooling lives in `h1.py`; this module knows nothing about other connections."""

from __future__ import annotations

import asyncio
import select
from typing import Final, cast

import httptools

# Above this many buffered body bytes the socket stops being read until the consumer
# catches up; taking from the buffer drains it completely, so reading resumes at zero.
HIGH_WATER_BYTES: Final = 256 * 1024
# A connection idle this long is polled for a close the event loop has not seen yet
# (a FIN that arrived this loop iteration). Servers close idle connections after
# seconds, so busy connections, reused within milliseconds, skip the syscall.
PROBE_AFTER_IDLE_S: Final = 0.1
# Timers may fire this early (uvloop rounds to milliseconds); close enough is expired.
TIMER_SLACK_S: Final = 0.001


class H1Error(Exception):
    """Base of every error the HTTP/1.1 client raises."""


class H1ConnectError(H1Error):
    """No connection could be opened (refused, DNS, TLS handshake): nothing was sent."""


class H1Timeout(H1Error, TimeoutError):
    """A bound passed: connect, a free pool slot, the whole request, or the gap between reads."""


class H1DeadlinePassed(H1Timeout):
    """The request's whole bound (`timeout_s`) passed; the connection was dropped."""


class H1ConnectTimeout(H1ConnectError, H1Timeout):
    """The connection (TCP and TLS) was not established in time: nothing was sent."""


class H1ProtocolError(H1Error):
    """The server's bytes are not an HTTP/1.1 response this client accepts."""


class H1Disconnected(H1Error):
    """The connection closed before the response was complete."""


class H1Connection(asyncio.Protocol):
    """One socket; at most one request in flight. Parser callbacks fill the exchange
    state below; the pool's `H1Response` reads it through `wait`/`take`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._poller: select.poll | None = None
        self._gone = False  # connection_lost has run
        self._gone_waiter: asyncio.Future[None] | None = None
        self.closed = False  # no further request may use this connection
        self.idle_since = 0.0
        # The exchange in flight.
        self._active = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.error: H1Error | None = None
        self._until_eof = False
        self._interim = False
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None
        self._deadline_s: float | None = None
        self._read_timeout_s: float | None = None
        self._last_rx = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's do not subclass asyncio's
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._poller = select.poll()
            self._poller.register(sock.fileno(), select.POLLIN)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._gone = True
        if self._active and not self.complete and self.error is None:
            if self.headers_done and self._until_eof:
                self._finish()  # a body delimited by the close, as HTTP/1.0 servers send
            else:
                reason = f": {exc}" if exc is not None else ""
                self._fail(H1Disconnected(f"the server closed the connection before the response was complete{reason}"))
        self._cancel_timer()
        self._wake()
        if self._gone_waiter is not None and not self._gone_waiter.done():
            self._gone_waiter.set_result(None)

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost follows

    def data_received(self, data: bytes) -> None:
        if not self._active:
            self.abort()  # bytes nobody asked for: the stream is out of step
            return
        if self._read_timeout_s is not None:
            self._last_rx = self._loop.time()
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self.complete:
                self.abort()  # surplus bytes after a complete response: never reuse
            elif self.error is None:
                self._fail(H1ProtocolError(f"invalid HTTP/1.1 response: {type(exc).__name__}: {exc}"))

    # -- httptools callbacks ---------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            raise H1ProtocolError("bytes after the end of the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.headers_done:
            return  # a chunked body's trailer fields: dropped, the caller already has the headers
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        previous = self.headers.get(key)
        self.headers[key] = text if previous is None else f"{previous}, {text}"

    def on_headers_complete(self) -> None:
        status: int = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._interim = True  # 1xx (e.g. 103 Early Hints): the real response follows
            self.headers = {}
            return
        self.status = status
        self.headers_done = True
        self.keep_alive = bool(self._parser.should_keep_alive())
        encoding = self.headers.get("transfer-encoding")
        if encoding is not None:
            self._until_eof = "chunked" not in encoding.lower()
        else:
            self._until_eof = "content-length" not in self.headers
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER_BYTES and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._finish()

    # -- used by the pool and its responses ------------------------------------------

    def send(self, request: bytes, now: float, deadline: float | None, timeout_s: float | None,
             read_timeout_s: float | None) -> None:
        """Write one whole request; the response state starts afresh. `now` and `deadline`
        are on the loop's clock; `timeout_s` only names the deadline in its error message."""
        assert self._transport is not None and not self._active
        self._active = True
        self.status = 0
        self.headers = {}
        self.headers_done = self.complete = self.keep_alive = False
        self.error = None
        self._chunks = []
        self._buffered = 0
        self._deadline_s = timeout_s
        self._read_timeout_s = read_timeout_s
        self._deadline = deadline
        self._transport.write(request)
        self._last_rx = now
        if deadline is not None or read_timeout_s is not None:
            self._arm_timer()

    def end_exchange(self) -> None:
        """The response handle is done with this exchange (released or dropped)."""
        self._active = False
        self._chunks = []
        self._buffered = 0
        self._cancel_timer()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and self.error is None and self.is_open()

    def is_open(self) -> bool:
        transport = self._transport
        return not self.closed and transport is not None and not transport.is_closing()

    def usable_when_idle(self, now: float) -> bool:
        """False if this idle connection is known (or found, by a zero-timeout poll) to be closed."""
        if not self.is_open():
            return False
        # Readable while idle means EOF, a reset, or bytes nobody asked for.
        return now - self.idle_since < PROBE_AFTER_IDLE_S or self._poller is None or not self._poller.poll(0)

    def loop_time(self) -> float:
        return self._loop.time()

    def has_data(self) -> bool:
        return self._buffered > 0 or bool(self._chunks)

    def take(self) -> bytes:
        """Every body byte received so far; resumes reading if it was paused."""
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._buffered = 0
        if self._paused:
            self._paused = False
            self._last_rx = self._loop.time()  # the gap while paused was ours, not the server's
            if self._transport is not None:
                self._transport.resume_reading()
        return data

    async def wait(self) -> None:
        """Until something changes: headers, body bytes, completion, an error."""
        waiter = self._loop.create_future()
        self._waiter = waiter
        await waiter

    def abort(self) -> None:
        """Close the socket now, without flushing or a TLS close_notify."""
        self.closed = True
        self._cancel_timer()
        if self._transport is not None and not self._gone:
            self._transport.abort()

    def gone_future(self) -> asyncio.Future[None] | None:
        """A future resolved by connection_lost, or None if that already ran."""
        if self._gone or self._transport is None:
            return None
        if self._gone_waiter is None:
            self._gone_waiter = self._loop.create_future()
        return self._gone_waiter

    # -- internals ---------------------------------------------------------------------

    def _finish(self) -> None:
        self.complete = True
        self._cancel_timer()
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()  # nothing more is expected; see surplus bytes
        self._wake()

    def _fail(self, error: H1Error) -> None:
        self.error = error
        self.abort()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _arm_timer(self) -> None:
        when = self._deadline
        if self._read_timeout_s is not None:
            gap_end = self._last_rx + self._read_timeout_s
            when = gap_end if when is None else min(when, gap_end)
        if when is not None:
            self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        # One handle for both bounds, re-armed on expiry rather than on every chunk.
        self._timer = None
        if self.complete or self.error is not None or not self._active:
            return
        now = self._loop.time() + TIMER_SLACK_S
        if self._deadline is not None and now >= self._deadline:
            self._fail(H1DeadlinePassed(f"no complete response within {self._deadline_s}s"))
            return
        if self._read_timeout_s is not None:
            if self._paused:
                self._last_rx = now  # the consumer is behind; the server is not silent
            elif now - self._last_rx >= self._read_timeout_s:
                self._fail(H1Timeout(f"no bytes from the server for {self._read_timeout_s}s"))
                return
        self._arm_timer()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
