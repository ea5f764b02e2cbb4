"""The gateway's HTTP/1.1 server connection: an `asyncio.Protocol` uvicorn runs in place
of its own (`uvicorn.Config(http=H1ServerConnection)`), so uvicorn keeps the sockets,
workers, lifespan, signals and graceful shutdown, and every request's parsing, scope
and response framing is done here.

Against uvicorn's httptools protocol it builds the ASGI scope from what httptools hands
over without re-parsing a plain path, wakes the app's `receive` with a future only when
it has to wait, drops a finished task from the server's set without a done-callback,
arms no timer per request, and frames responses as `h1_exchange` says. Measured with
bench/server_glue.py it costs a trivial app 94 us per call over a bare protocol where
uvicorn's costs 109 (c=1); the gateway spends ~3 % less CPU per call at c=16.

It owns keep-alive (with uvicorn's `timeout_keep_alive`), pipelining (one request
answered at a time, in order), flow control both ways, a bound on the request head
(431 beyond `MAX_HEAD_BYTES`) and 400 for bytes that are not HTTP/1.1. It serves no
upgrade (websocket, h2c): such a request is answered over HTTP/1.1, then the connection
closes."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import unquote

import httptools

from gateway.serving.h1_exchange import HANG_UP, ASGIApp, Exchange, plain_response

if TYPE_CHECKING:
    import uvicorn
    from uvicorn.server import ServerState

# Above this many buffered request-body bytes the socket stops being read until the
# app takes them.
HIGH_WATER_BYTES: Final = 64 * 1024
# Request line and headers together; larger heads are refused with 431.
MAX_HEAD_BYTES: Final = 64 * 1024
ASGI_VERSION: Final = {"version": "3.0", "spec_version": "2.3"}
log = logging.getLogger("gateway.serving")


class H1ServerConnection(asyncio.Protocol):
    """One client connection. The parser's callbacks build each request's `Exchange`;
    the exchange at the head of the line runs the app in a task of its own."""

    def __init__(self, config: uvicorn.Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        if not config.loaded:
            config.load()
        self.loop = _loop or asyncio.get_event_loop()
        self._app: ASGIApp = config.loaded_app
        self._root_path = config.root_path
        self._keep_alive_s = config.timeout_keep_alive
        self._state = server_state
        self._app_state = app_state
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._server: tuple[str, int] | None = None
        self._client: tuple[str, int] | None = None
        self._scheme = "http"
        # Idle since (loop time), or None while a request is in: the timer is armed once
        # per idle stretch and re-armed when it finds the connection was used meanwhile,
        # so a busy connection pays no timer per request.
        self._idle_since: float | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._read_paused = False
        self.write_paused = False
        self._writable: asyncio.Future[None] | None = None
        self._defaults_from: list[tuple[bytes, bytes]] | None = None
        self._defaults: list[bytes] = []
        # Requests: the one being answered, then any pipelined behind it, in order.
        self._active: Exchange | None = None
        self._queued: collections.deque[Exchange] = collections.deque()
        # The request being parsed.
        self._parsing: Exchange | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._expect_continue = False
        self._upgraded = False

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        self._transport = transport
        self._state.connections.add(self)  # type: ignore[arg-type]
        self._server = _address(transport.get_extra_info("sockname"))
        self._client = _address(transport.get_extra_info("peername"))
        if transport.get_extra_info("sslcontext") is not None:
            self._scheme = "https"
        self._idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._state.connections.discard(self)  # type: ignore[arg-type]
        self._cancel_idle_timer()
        for exchange in (self._active, *self._queued):
            if exchange is not None and not exchange.complete:
                exchange.lose()
        self._queued.clear()
        if self._parsing is not None and not self._parsing.complete:
            self._parsing.lose()
        self._resume_writers()

    def data_received(self, data: bytes) -> None:
        self._idle_since = None
        if self._upgraded:
            return  # the bytes after an upgrade request are not HTTP/1.1; the close is coming
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No upgrade is served (h2c, websocket): the request is answered as HTTP/1.1
            # and the connection closes after it.
            self._upgraded = True
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # what a callback raised, if one did
            self._refuse(cause if isinstance(cause, Refusal) else Refusal(400, f"Invalid HTTP request: {exc}"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self._resume_writers()

    # -- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        self._expect_continue = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        version = parser.get_http_version()
        url = self._url
        if url[:1] == b"/" and b"?" not in url and b"%" not in url:
            raw_path, query = url, b""
            path = url.decode("latin-1")
        else:
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path, parsed.query or b""
            path = unquote(raw_path.decode("latin-1"))
        scope = {
            "type": "http", "asgi": ASGI_VERSION, "http_version": version, "server": self._server,
            "client": self._client, "scheme": self._scheme, "method": parser.get_method().decode("ascii"),
            "root_path": self._root_path, "path": self._root_path + path,
            "raw_path": self._root_path.encode() + raw_path, "query_string": query, "headers": self._headers,
            "state": self._app_state.copy(),
        }
        keep_alive = parser.should_keep_alive()
        if parser.should_upgrade():
            # httptools hands a request that asks to upgrade over without its body.
            if any(name in (b"content-length", b"transfer-encoding") for name, _ in self._headers):
                raise Refusal(400, "Upgrade is not served here; send the request without an Upgrade header.")
            keep_alive = False
        exchange = Exchange(self, scope, keep_alive, self._expect_continue)
        scope["extensions"] = {HANG_UP: exchange.on_hang_up}
        self._parsing = exchange
        if self._active is None:
            self._start(exchange)
        else:
            self._queued.append(exchange)
            self._pause_reading()  # one request ahead is enough; TCP holds the rest

    def on_body(self, body: bytes) -> None:
        exchange = self._parsing
        if exchange is not None and not exchange.complete and exchange.add_body(body) > HIGH_WATER_BYTES:
            self._pause_reading()

    def on_message_complete(self) -> None:
        exchange = self._parsing
        if exchange is not None:
            exchange.end_body()

    # -- what the exchange asks of its connection -------------------------------------

    def write(self, data: bytes) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def drain(self) -> None:
        if self._writable is None:
            self._writable = self.loop.create_future()
        await asyncio.shield(self._writable)

    def add_default_headers(self, lines: list[bytes]) -> None:
        """The server's own headers (date, server), re-encoded when uvicorn renews them
        (once a second)."""
        defaults = self._state.default_headers
        if defaults is not self._defaults_from:
            self._defaults_from = defaults
            self._defaults = [b"%s: %s\r\n" % (name, value) for name, value in defaults]
        lines[1:1] = self._defaults

    def body_taken(self) -> None:
        """The app took the buffered body: read on, unless a pipelined request waits."""
        if self._read_paused and self._active is not None and not self._queued:
            self._resume_reading()

    def response_done(self, exchange: Exchange) -> None:
        self._state.total_requests += 1
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if not exchange.keep_alive:
            transport.close()
            return
        self._active = None
        if self._queued:
            self._start(self._queued.popleft())
        else:
            self._resume_reading()
            self._idle()

    def exchange_done(self, exchange: Exchange) -> None:
        self._state.tasks.discard(exchange.task)  # type: ignore[arg-type]

    # -- uvicorn's server ---------------------------------------------------------------

    def shutdown(self) -> None:
        """Graceful shutdown: close now if idle, else after the response in progress."""
        if self._active is None or self._active.complete:
            self.close()
        else:
            self._active.keep_alive = False
            self._queued.clear()

    # -- internals ----------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self._active = exchange
        task = self.loop.create_task(exchange.run(self._app))
        exchange.task = task
        self._state.tasks.add(task)

    def _refuse(self, refusal: Refusal) -> None:
        log.warning("%d to %s: %s", refusal.status, self._client, refusal.text)
        if self._active is None or not self._active.started:
            self.write(plain_response(refusal.status, refusal.text))
        self.close()

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise Refusal(431, f"The request head is over {MAX_HEAD_BYTES} bytes.")

    def _pause_reading(self) -> None:
        if not self._read_paused and self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()

    def _resume_writers(self) -> None:
        self.write_paused = False
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle(self) -> None:
        self._idle_since = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_later(self._keep_alive_s, self._idle_timeout)

    def _idle_timeout(self) -> None:
        self._idle_timer = None
        if self._idle_since is None:
            return  # a request is in: its response arms the timer again
        left = self._idle_since + self._keep_alive_s - self.loop.time()
        if left > 0:
            self._idle_timer = self.loop.call_later(left, self._idle_timeout)
        else:
            self.close()


class Refusal(Exception):
    """Raised in a parser callback: the request is answered with `status` and the
    connection closed."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, tuple) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None
