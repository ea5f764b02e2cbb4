"""A scripted `Upstream` (gateway/upstreams/base.py): each call takes the next reply
from its script - a JSON answer with usage, a streamed answer, an error reply, a raised
error, or a hang until cancelled - and every call is recorded as the upstream saw it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.errors import GatewayError, UpstreamError, UpstreamTimeout
from gateway.upstreams.base import PoolRequest, StreamBroken, UpstreamReply

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted outcome. `raises`: raised instead of answering; `hang`: never
    answers (or, with `chunks`, stops after them) until the caller cancels;
    `held_until`: answers once the test sets it."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    chunks: tuple[bytes, ...] | None = None
    raises: GatewayError | StreamBroken | None = None
    hang: bool = False
    held_until: asyncio.Event | None = None  # answers only once this is set


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def answer(text: str = "Hello there.", *, prompt: int = 10, completion: int = 5, model: str = "upstream-model",
           finish_reason: str = "stop", headers: Mapping[str, str] | None = None) -> Reply:
    """A chat completion with its usage."""
    body = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}],
            "usage": usage(prompt, completion)}
    return Reply(200, orjson.dumps(body), {"content-type": "application/json", **(headers or {})})


def json_reply(body: Any, status: int = 200) -> Reply:
    return Reply(status, orjson.dumps(body), {"content-type": "application/json"})


def event(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def chunk(content: str | None = None, *, finish_reason: str | None = None, role: bool = False) -> bytes:
    delta: dict[str, str] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    return event({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "upstream-model",
                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})


def streamed(*words: str, prompt: int = 10, completion: int = 5, with_usage: bool = True, done: bool = True) -> Reply:
    """A streamed chat answer: a role chunk, one chunk per word, the finish chunk, the
    usage chunk (as `stream_options.include_usage` asks) and [DONE]."""
    chunks = [chunk(role=True), *(chunk(w) for w in words), chunk(finish_reason="stop")]
    if with_usage:
        chunks.append(event({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "upstream-model",
                             "choices": [], "usage": usage(prompt, completion)}))
    if done:
        chunks.append(DONE)
    return Reply(200, chunks=tuple(chunks), headers={"content-type": "text/event-stream"})


def error(status: int, message: str = "something failed", *, code: str | None = None, kind: str = "server_error",
          headers: Mapping[str, str] | None = None) -> Reply:
    """An error reply as OpenAI sends it."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return Reply(status, orjson.dumps(body), {"content-type": "application/json", **(headers or {})})


def rate_limited(retry_after_s: float) -> Reply:
    return error(429, "Rate limit reached", code="rate_limit_exceeded", kind="requests",
                 headers={"retry-after-ms": str(int(retry_after_s * 1000))})


def timeout() -> Reply:
    """The upstream's own timer ran out (it enforces the deadline it is given)."""
    return Reply(raises=UpstreamTimeout("upstream `fake` did not answer in time"))


def unreachable() -> Reply:
    return Reply(raises=UpstreamError("upstream `fake` could not be reached: ClientConnectorError"))


def raises(exc: GatewayError | StreamBroken) -> Reply:
    return Reply(raises=exc)


def hang() -> Reply:
    return Reply(hang=True)


@dataclass(slots=True)
class Sent:
    """One call as the upstream received it."""

    path: str
    body: dict[str, Any]
    timeout_s: float
    pool: PoolRequest | None
    headers: dict[str, str]
    stream: bool
    cancelled: bool = False  # the caller gave up while it was waiting (or streaming)
    closed: bool = False  # a stream the caller closed


class FakeStream:
    def __init__(self, reply: Reply, sent: Sent, max_event_bytes: int) -> None:
        self.status, self.headers, self.replica = reply.status, dict(reply.headers), "fake://replica"
        self.max_event_bytes = max_event_bytes
        self._reply, self._sent = reply, sent

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self.status != 200:
            yield self._reply.body
            return
        for part in self._reply.chunks or ():
            yield part
        if isinstance(self._reply.raises, StreamBroken):
            raise self._reply.raises
        if self._reply.hang:
            await _wait_forever(self._sent)

    async def aclose(self) -> None:
        self._sent.closed = True


class FakeUpstream:
    """`Upstream` with a script. When the script runs out, the last reply repeats."""

    def __init__(self, name: str, *script: Reply, kind: str = "openai", max_event_bytes: int = 1024 * 1024,
                 headers: dict[str, str] | None = None, sent: list[Sent] | None = None) -> None:
        self.name, self.kind = name, kind
        self.secrets: tuple[str, ...] = ("sk-fake-secret",)
        self.script: deque[Reply] = deque(script or (answer(),))
        self.sent: list[Sent] = [] if sent is None else sent
        self.max_event_bytes = max_event_bytes
        self._headers = headers or {}
        # Runs as each call arrives, before it is answered: to look at what the gateway
        # had done by then (its hold, say).
        self.on_call: Callable[[Sent], Awaitable[None]] | None = None

    def then(self, *replies: Reply) -> FakeUpstream:
        self.script.extend(replies)
        return self

    def with_headers(self, headers: Mapping[str, str]) -> FakeUpstream:
        view = FakeUpstream(self.name, kind=self.kind, headers={**self._headers, **headers}, sent=self.sent)
        view.script = self.script  # one script, whichever view is called
        view.on_call = self.on_call
        return view

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [s.body for s in self.sent]

    def _next(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None, stream: bool) -> tuple[Reply, Sent]:
        sent = Sent(path, orjson.loads(body), timeout_s, pool, dict(self._headers), stream)
        self.sent.append(sent)
        reply = self.script.popleft() if len(self.script) > 1 else self.script[0]
        return reply, sent

    async def send(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None) -> UpstreamReply:
        reply, sent = self._next(path, body, timeout_s, pool, stream=False)
        if self.on_call is not None:
            await self.on_call(sent)
        await _before_answer(reply, sent)
        if reply.chunks is not None:
            return UpstreamReply(reply.status, dict(reply.headers), b"".join(reply.chunks), "fake://replica")
        return UpstreamReply(reply.status, dict(reply.headers), reply.body, "fake://replica")

    async def open_stream(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None) -> FakeStream:
        reply, sent = self._next(path, body, timeout_s, pool, stream=True)
        if self.on_call is not None:
            await self.on_call(sent)
        await _before_answer(reply, sent)
        return FakeStream(reply, sent, self.max_event_bytes)

    async def aclose(self) -> None:
        pass


async def _before_answer(reply: Reply, sent: Sent) -> None:
    if isinstance(reply.raises, GatewayError):
        raise reply.raises
    if reply.hang and reply.chunks is None:
        await _wait_forever(sent)
    if reply.held_until is not None:
        await reply.held_until.wait()


async def _wait_forever(sent: Sent) -> None:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        sent.cancelled = True
        raise
