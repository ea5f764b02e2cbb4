"""The OpenAI endpoints every model call goes through, served as plain ASGI in front
of the framework: the app's routing, dependency and middleware layers cost ~13 % of
the request path's CPU in a profile, and these handlers only move bytes - read the
body (with a size limit), hand it to the pipeline, send its reply. gateway.app sends
every other route to the framework app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from gateway.caching.replay import DONE_EVENT
from gateway.errors import BodyTooLarge, GatewayError
from gateway.pipeline.runner import JsonReply, StreamReply
from gateway.services import Services
from gateway.serving.busy_poll import BusyPoll
from gateway.serving.h1_exchange import HANG_UP

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
HangUpHook = Callable[[Callable[[], object] | None], bool]

HOT = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}
JSON = b"application/json"
STREAM_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
log = logging.getLogger("gateway.api")


class Disconnected(Exception):
    pass


def hot_endpoint(scope: Scope) -> str | None:
    """The pipeline endpoint a request goes to, if it is one of the hot paths."""
    return HOT.get(scope["path"]) if scope["method"] == "POST" else None


class HotPaths:
    def __init__(self, services: Services) -> None:
        self.services = services
        metrics = services.metrics
        self.busy_poll = BusyPoll(services.settings.gateway_busy_poll_us / 1e6, lambda: metrics.serving)

    async def __call__(self, endpoint: str, scope: Scope, receive: Receive, send: Send) -> None:
        services = self.services
        metrics = services.metrics
        metrics.serving += 1  # until the reply is sent to its end (a stream's last event)
        touch = self.busy_poll.touch
        touch()
        try:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            try:
                raw = await read_body(headers, receive, services.policies.current.policy.defaults.max_body_bytes)
                reply = await services.pipeline.run(endpoint, raw, headers)
            except GatewayError as exc:
                await send_error(send, exc)
                return
            except Disconnected:
                return
            except Exception:
                log.exception("unhandled error on POST %s", scope["path"])
                await send_error(send, GatewayError("the gateway hit an internal error; it has been logged"))
                return
            if isinstance(reply, JsonReply):
                await send_whole(send, reply.status, reply.body, reply.headers)
            else:
                await stream(reply, receive, send, scope.get("extensions", {}).get(HANG_UP), touch)
        finally:
            metrics.serving -= 1
            touch()  # the client's next request may follow at once


async def read_body(headers: dict[str, str], receive: Receive, limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body is over the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def send_whole(send: Send, status: int, body: bytes, headers: dict[str, str]) -> None:
    raw_headers = [(b"content-type", JSON), (b"content-length", str(len(body)).encode()), *_encoded(headers)]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: GatewayError) -> None:
    """`error` in OpenAI's shape, with its status and headers."""
    await send_whole(send, error.http_status, orjson.dumps(error.body()), error.response_headers())


async def stream(reply: StreamReply, receive: Receive, send: Send, hang_up: HangUpHook | None = None,
                 touch: Callable[[], None] | None = None) -> None:
    """Relay the reply's events as they come, in this task, so the first one goes out
    without a hand-off to another. A client that hangs up cancels the relay (see
    `HangUpWatch`), whose cleanup closes the upstream connection (so vLLM aborts the
    work).

    The `[DONE]` event waits for the reply's end (the upstream's end of body, normally
    in the same read or the next), so that both leave in one write: a client's stream
    ends when its body does (the openai SDK reads to there), one system call sooner.
    `touch` is called as each piece comes (see serving/busy_poll.py)."""
    await send({"type": "http.response.start", "status": 200, "headers": [*STREAM_HEADERS, *_encoded(reply.headers)]})
    relay = asyncio.current_task()
    assert relay is not None
    watch = HangUpWatch(receive, relay, hang_up)
    try:
        last = b""  # the events ending in [DONE]: they go out with the body's end, in one write
        async for chunk in reply.chunks:
            if touch is not None:
                touch()
            if last:
                await send({"type": "http.response.body", "body": last, "more_body": True})
            if chunk.endswith(DONE_EVENT):
                last = chunk
            else:
                last = b""
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": last})
    except asyncio.CancelledError:
        if not watch.fired():  # not the watcher's doing
            raise
        relay.uncancel()  # our own cancellation, for the hang-up: the relay is simply over
    except Exception as exc:
        log.warning("stream relay failed: %s", exc)
    finally:
        await watch.stop()
        aclose = getattr(reply.chunks, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


class HangUpWatch:
    """Watches for the client hanging up and cancels `relay` when it does.

    A server that offers the `HANG_UP` extension (this project's, gateway/serving) calls
    the watch back: no task at all. Otherwise a task waits in `receive` for the
    disconnect. It is started in the loop's next turn, not at once: when the first event
    is already in hand the relay sends it before that turn comes, so starting a task
    (~16 us here) is not part of the time to the first token; when the relay has to wait
    for the upstream, the turn comes at once and the watch is on for the wait."""

    def __init__(self, receive: Receive, relay: asyncio.Task[Any], hang_up: HangUpHook | None = None) -> None:
        self._receive, self._relay = receive, relay
        self._task: asyncio.Task[None] | None = None
        self._starting: asyncio.Handle | None = None
        self._hook = hang_up
        self._hung_up = False
        if hang_up is None:
            self._starting = asyncio.get_running_loop().call_soon(self._start)
        elif not hang_up(self._on_hang_up):  # gone already
            self._on_hang_up()

    def _on_hang_up(self) -> None:
        self._hung_up = True
        self._relay.cancel()

    def _start(self) -> None:
        self._starting = None
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._hung_up = True
        self._relay.cancel()

    def fired(self) -> bool:
        """Whether the relay's cancellation is this watch's doing."""
        return self._hung_up

    async def stop(self) -> None:
        if self._hook is not None:
            self._hook(None)
            self._hook = None
        if self._starting is not None:
            self._starting.cancel()
            self._starting = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
