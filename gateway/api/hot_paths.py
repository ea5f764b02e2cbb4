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

from gateway.api.anthropic_errors import anthropic_body, anthropic_headers, anthropic_status
from gateway.caching.replay import DONE_EVENT
from gateway.errors import BodyTooLarge, GatewayError
from gateway.pipeline.runner import JsonReply, StreamReply
from gateway.services import Services

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

HOT = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions", "/v1/embeddings": "embeddings",
       "/v1/messages": "messages", "/v1/messages/count_tokens": "messages.count_tokens", "/v1/responses": "responses"}
RESPONSES = "responses"  # served by the Responses service, over the chat pipeline
# Endpoints whose clients speak Anthropic's dialect, errors included.
ANTHROPIC_ENDPOINTS = frozenset({"messages", "messages.count_tokens"})
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

    async def __call__(self, endpoint: str, scope: Scope, receive: Receive, send: Send) -> None:
        services = self.services
        pipeline = services.pipeline
        anthropic = endpoint in ANTHROPIC_ENDPOINTS
        pipeline.serving += 1  # until the reply is sent to its end (a stream's last event)
        try:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            try:
                raw = await read_body(headers, receive, services.policies.current.policy.defaults.max_body_bytes)
            except GatewayError as exc:
                exc.headers.setdefault("x-request-id", services.pipeline.parts.ids.next())
                await send_error(send, exc, anthropic=anthropic)
                return
            except Disconnected:
                return
            # From here on a client that hangs up cancels the call, wherever it is: waiting
            # in the admission queue, waiting for the upstream (which is then aborted), or
            # relaying its stream.
            async with HangUpWatch(receive) as watch:
                await self._answer(endpoint, scope["path"], raw, headers, send, anthropic)
            if watch.fired():
                log.debug("the client hung up on POST %s", scope["path"])
        finally:
            pipeline.serving -= 1

    async def _answer(self, endpoint: str, path: str, raw: bytes, headers: dict[str, str], send: Send, anthropic: bool) -> None:
        try:
            if endpoint == RESPONSES:
                reply = await self.services.responses.create(raw, headers)
            else:
                reply = await self.services.pipeline.run(endpoint, raw, headers)
        except GatewayError as exc:
            await send_error(send, exc, anthropic=anthropic)
            return
        except Exception:
            request_id = self.services.pipeline.parts.ids.next()
            log.exception("unhandled error on POST %s (request %s)", path, request_id)
            await send_error(send, GatewayError("the gateway hit an internal error; it has been logged",
                                                headers={"x-request-id": request_id}), anthropic=anthropic)
            return
        if isinstance(reply, JsonReply):
            await send_whole(send, reply.status, reply.body, reply.headers)
        else:
            await stream(reply, send, anthropic=anthropic)


async def read_body(headers: dict[str, str], receive: Receive, limit: int) -> bytes:
    # `connection: close` with the 413: otherwise the server would go on reading (and
    # dropping) the rest of an upload it has already refused.
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the request body is {declared} bytes; the limit is {limit}", headers={"connection": "close"})
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body is over the limit of {limit} bytes", headers={"connection": "close"})
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def send_whole(send: Send, status: int, body: bytes, headers: dict[str, str]) -> None:
    raw_headers = [(b"content-type", JSON), (b"content-length", str(len(body)).encode()), *_encoded(headers)]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: GatewayError, *, anthropic: bool = False) -> None:
    """`error` in OpenAI's shape (or `anthropic`'s, for the Messages API), with its status and headers."""
    if anthropic:
        await send_whole(send, anthropic_status(error), orjson.dumps(anthropic_body(error)), anthropic_headers(error))
        return
    await send_whole(send, error.http_status, orjson.dumps(error.body()), error.response_headers())


async def stream(reply: StreamReply, send: Send, *, anthropic: bool = False) -> None:
    """Relay the reply's events as they come. The head waits for the first event, so an
    upstream that fails before it (an event over the gateway's bound, say) is still an
    error with its own status rather than a 200 that breaks off.

    The `[DONE]` event waits for the reply's end (the upstream's end of body, normally
    in the same read or the next), so that both leave in one write: a client's stream
    ends when its body does (the openai SDK reads to there)."""
    chunks = reply.chunks
    try:
        try:
            chunk = await anext(chunks, None)
        except GatewayError as exc:
            await send_error(send, exc, anthropic=anthropic)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [*STREAM_HEADERS, *_encoded(reply.headers)]})
        held = b""  # the events ending in [DONE]: they go out with the body's end, in one write
        while chunk is not None:
            if held:
                await send({"type": "http.response.body", "body": held, "more_body": True})
            if chunk.endswith(DONE_EVENT):
                held = chunk
            else:
                held = b""
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            chunk = await anext(chunks, None)
        await send({"type": "http.response.body", "body": held})
    except Exception as exc:
        log.warning("stream relay failed: %s", exc)
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


class HangUpWatch:
    """Cancels the task that entered it when the client hangs up (ASGI's
    `http.disconnect`), and swallows that cancellation on the way out: the request is
    simply over. The pipeline's own clean-up books the call and aborts the upstream."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task: asyncio.Task[None] | None = None
        self._owner: asyncio.Task[Any] | None = None
        self._hung_up = False

    async def __aenter__(self) -> HangUpWatch:
        self._owner = asyncio.current_task()
        self._task = asyncio.ensure_future(self._watch())
        return self

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._hung_up = True
        if self._owner is not None:
            self._owner.cancel()

    def fired(self) -> bool:
        return self._hung_up

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> bool:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._hung_up and isinstance(error, asyncio.CancelledError) and self._owner is not None:
            self._owner.uncancel()
            return True  # our own cancellation, for the hang-up
        return False
