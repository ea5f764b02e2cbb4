"""One request and its response on a server connection: the ASGI `receive` and `send`
the app is given, and the bytes they put on the wire.

The response head is encoded without regular expressions: header names are checked
against the token characters and values for CR, LF and NUL with `bytes.translate`,
one C call each (uvicorn's two regex searches per header were ~20 us of every
response's start on the gateway's path). A response's head waits for its first body
message, so that head and body leave in one write (one syscall, one segment); a
stream's (chunked, or to an HTTP/1.0 client until the close) waits at most
`STREAM_HEAD_WAIT_S` for it."""

from __future__ import annotations

import asyncio
import http
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from gateway.serving.h1_connection import H1ServerConnection

Message = MutableMapping[str, Any]
ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]

STATUS_LINES: Final = {status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode()) for status in http.HTTPStatus}
# RFC 9110 token characters: what a field name may be made of.
TOKEN: Final = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
FORBIDDEN_IN_VALUE: Final = b"\r\n\0"
CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
NO_BODY_STATUSES: Final = frozenset({204, 304})
# How long a stream's head waits for the first event to leave with it. A fast upstream's
# first event follows its head within a fraction of a millisecond: waiting saves a write
# (and the client a wake-up) on the way to the first token. A model that thinks longer
# leaves the client seeing the stream open this much later, long before its first token.
STREAM_HEAD_WAIT_S: Final = 0.002
# The scope's extension through which an app asks to be called when its client hangs up,
# instead of waiting in `receive` for the disconnect in a task of its own:
# `scope["extensions"][HANG_UP]`, called with a callback (or None, to stop), returns
# False when the client is gone already.
HANG_UP: Final = "gateway.hang_up"
# How a response's body is delimited on the wire.
NONE, LENGTH, CHUNKED, CLOSE = "none", "length", "chunked", "close"
log = logging.getLogger("gateway.serving")


def plain_response(status: int, text: str) -> bytes:
    """A complete text/plain response that closes the connection."""
    body = text.encode()
    return (b"%scontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
            % (STATUS_LINES[status], len(body), body))


class ResponseError(RuntimeError):
    """The app sent messages that are not a valid HTTP response (the connection closes)."""


def encode_head(status: int, headers: Iterable[tuple[bytes, bytes]]) -> tuple[list[bytes], int | None, bool]:
    """(the head's lines without the blank line, the declared content-length, whether
    `connection: close` was asked for). Raises ResponseError for a field that could
    split the head or smuggle a header."""
    line = STATUS_LINES.get(status)
    if line is None:
        if not 100 <= status <= 999:
            raise ResponseError(f"status {status!r} is not an HTTP status code")
        line = b"HTTP/1.1 %d \r\n" % status
    lines = [line]
    length: int | None = None
    close = False
    for name, value in headers:
        if not name or name.translate(None, TOKEN) or len(value.translate(None, FORBIDDEN_IN_VALUE)) != len(value):
            raise ResponseError(f"invalid response header {name!r}: {value!r}")
        name = name.lower()
        if name == b"content-length":
            if not value.isdigit():
                raise ResponseError(f"invalid content-length {value!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            continue  # the framing is this module's to choose
        elif name == b"connection" and b"close" in value.lower():
            close = True
        lines.append(b"%s: %s\r\n" % (name, value))
    return lines, length, close


class Exchange:
    """The request's body as the parser delivers it, and the response as the app sends
    it. The connection feeds `add_body` / `end_body` / `lose`; the app task calls
    `receive` / `send` from `run`."""

    __slots__ = (
        "_await_continue",
        "_body_delivered",
        "_buffered",
        "_chunks",
        "_conn",
        "_framing",
        "_head",
        "_head_timer",
        "_more_body",
        "_on_hang_up",
        "_remaining",
        "_waiter",
        "complete",
        "disconnected",
        "keep_alive",
        "scope",
        "started",
        "task",
    )

    def __init__(self, conn: H1ServerConnection, scope: MutableMapping[str, Any], keep_alive: bool,
                 expect_continue: bool) -> None:
        self._conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self._await_continue = expect_continue
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._more_body = True
        self._body_delivered = False
        self._waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.started = False
        self.complete = False
        self._head: bytes | None = None  # encoded, waiting for the first body message
        self._head_timer: asyncio.TimerHandle | None = None  # a stream's head goes alone when it fires
        self._on_hang_up: Callable[[], object] | None = None
        self._framing = NONE
        self._remaining = 0  # bytes still owed to a declared content-length
        self.task: asyncio.Task[None] | None = None

    # -- from the connection -----------------------------------------------------------

    def add_body(self, chunk: bytes) -> int:
        """Buffer `chunk`; returns the bytes now buffered."""
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        self._wake()
        return self._buffered

    def end_body(self) -> None:
        self._more_body = False
        self._wake()

    def lose(self) -> None:
        """The client went away: receive reports it, send drops what it is given, and
        the app's hang-up callback (`HANG_UP`) is called."""
        self.disconnected = True
        self._wake()
        callback, self._on_hang_up = self._on_hang_up, None
        if callback is not None:
            callback()

    def on_hang_up(self, callback: Callable[[], object] | None) -> bool:
        """Call `callback` when the client goes away, replacing any earlier one (None:
        none). False, and no call, if it is gone already."""
        if self.disconnected:
            return False
        self._on_hang_up = callback
        return True

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the app's side ------------------------------------------------------------------

    async def run(self, app: ASGIApp) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("unhandled error in the app on %s %s", self.scope["method"], self.scope["path"], exc_info=exc)
            if not self.started and not self.disconnected:
                self._write_internal_error()
            else:
                self._conn.close()
            if not isinstance(exc, Exception):
                raise
        else:
            if not self.complete and not self.disconnected:
                log.error("the app returned without completing its response to %s %s", self.scope["method"],
                          self.scope["path"])
                if self.started:
                    self._conn.close()
                else:
                    self._write_internal_error()
        finally:
            self._conn.exchange_done(self)

    async def receive(self) -> Message:
        if self._await_continue:
            self._await_continue = False
            if not self.disconnected and not self.complete:
                self._conn.write(CONTINUE)
        while not (self.disconnected or self.complete):
            if self._chunks or (not self._more_body and not self._body_delivered):
                body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
                self._chunks = []
                self._buffered = 0
                self._body_delivered = not self._more_body
                self._conn.body_taken()
                return {"type": "http.request", "body": body, "more_body": self._more_body}
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self._conn.write_paused and not self.disconnected:
            await self._conn.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise ResponseError(f"expected 'http.response.start', got {kind!r}")
            self._start(message["status"], message.get("headers", ()))
        elif not self.complete:
            if kind != "http.response.body":
                raise ResponseError(f"expected 'http.response.body', got {kind!r}")
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise ResponseError(f"{kind!r} sent after the response was complete")

    def _start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        lines, length, close = encode_head(status, headers)
        self.started = True
        self._await_continue = False  # the app answered without reading the body
        self._conn.add_default_headers(lines)
        if close:
            self.keep_alive = False
        if self.scope["method"] == "HEAD" or status in NO_BODY_STATUSES or status < 200:
            self._framing = NONE  # no body goes out, whatever was declared
        elif length is not None:
            self._framing, self._remaining = LENGTH, length
        elif self.scope["http_version"] == "1.0":
            self._framing = CLOSE  # HTTP/1.0 has no chunked coding: the close ends the body
            self.keep_alive = False
        else:
            self._framing = CHUNKED
            lines.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive and not close:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        self._head = b"".join(lines)
        if self._framing is CHUNKED or self._framing is CLOSE:
            # A stream's head goes out with its first event when that comes soon, and on
            # its own when it does not (the client sees the stream open while the upstream
            # thinks).
            self._head_timer = self._conn.loop.call_later(STREAM_HEAD_WAIT_S, self._send_head)

    def _send_head(self) -> None:
        self._head_timer = None
        head, self._head = self._head, None
        if head is not None and not self.disconnected:
            self._conn.write(head)

    def _body(self, body: bytes, more: bool) -> None:
        out = self._head or b""
        self._head = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        framing = self._framing
        if framing is CHUNKED:
            if body:
                out += b"%x\r\n%s\r\n" % (len(body), body)
            if not more:
                out += b"0\r\n\r\n"
        elif body and framing is not NONE:
            if framing is LENGTH:
                self._remaining -= len(body)
                if self._remaining < 0:
                    self._conn.close()
                    raise ResponseError("the response body is longer than its content-length")
            out = out + body if out else body
        if out:
            self._conn.write(out)
        if not more:
            if framing is LENGTH and self._remaining:
                self._conn.close()
                raise ResponseError("the response body is shorter than its content-length")
            self.complete = True
            self._wake()
            self._conn.response_done(self)

    def _write_internal_error(self) -> None:
        self.keep_alive = False
        self.started = self.complete = True
        self._conn.write(plain_response(500, "Internal Server Error"))
        self._conn.response_done(self)
