"""The gateway's HTTP/1.1 server: uvicorn's own httptools protocol with two bounds a
public endpoint needs and stock uvicorn does not set.

- A request head (request line and headers) over `MAX_HEAD_BYTES` gets 431 and the
  connection closes, before the app sees it.
- A request head must arrive within `HEAD_TIMEOUT_S` of the connection opening or of
  its first byte; a client that dribbles it gets 408 and the connection closes, so
  slow heads cannot hold connections open for as long as the client likes.

Everything else (keep-alive, pipelining, flow control, framing, what is refused as
malformed, graceful shutdown, `http.disconnect`) is uvicorn's, unchanged."""

from __future__ import annotations

import asyncio
from typing import Any, Final

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

MAX_HEAD_BYTES: Final = 64 * 1024
HEAD_TIMEOUT_S: Final = 10.0


class HeadTooLarge(Exception):
    pass


class BoundedHttpProtocol(HttpToolsProtocol):
    head_timeout_s: float = HEAD_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._in_head = False
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_started()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._in_head and (self.cycle is None or self.cycle.response_complete):
            self._head_started()  # the next request's first bytes
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, HeadTooLarge):
                self._refuse(431, "Request Header Fields Too Large")
                return
            self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    # -- parser callbacks: count the head's bytes --------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if not self._in_head:
            self._head_started()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_done()
        super().on_headers_complete()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise HeadTooLarge

    # -- the head's time bound -----------------------------------------------------------

    def _head_started(self) -> None:
        self._in_head = True
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _head_done(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head behind a response still being sent: its turn has not come.
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)
            return
        self._refuse(408, "Request Timeout")

    def _refuse(self, status: int, message: str) -> None:
        self._head_done()
        body = message.encode("ascii")
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()
