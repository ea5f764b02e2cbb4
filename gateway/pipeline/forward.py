"""The upstream call: one attempt against one target, non-streaming or streamed
through chunk by chunk, always inside the request's deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import orjson

from gateway.caching.replay import DONE_EVENT
from gateway.errors import GatewayError, PoolSpill, ReplicaFailed, UpstreamError, UpstreamReplyTooLarge, UpstreamTimeout
from gateway.pipeline import anthropic_stream, messages
from gateway.pipeline.usage_estimate import relayed_text
from gateway.request_context import Attempt, RequestContext
from gateway.routing.resolved import ModelTarget
from gateway.telemetry.timeline import Timeline
from gateway.types.usage import Usage
from gateway.upstreams.base import PoolRequest, StreamBroken, Upstream, UpstreamStream
from gateway.upstreams.sse import SseRelay, data_event
from gateway.upstreams.translate import error_from_reply, limit_headers

T = TypeVar("T")
Answer = tuple[dict[str, Any], bytes]  # an upstream's JSON answer, parsed and as it came
MAX_ERROR_BODY = 64 * 1024
MAX_KEPT_BYTES = 4 * 1024 * 1024


def remaining_s(ctx: RequestContext) -> float:
    left = ctx.deadline - time.monotonic()
    if left <= 0:
        raise UpstreamTimeout("the request deadline passed before the upstream answered")
    return left


def _new_attempt(ctx: RequestContext, target: ModelTarget) -> Attempt:
    attempt = Attempt(target=target, timeline=Timeline())
    attempt.timeline.mark("upstream_start")
    if ctx.timeline.upstream_start is None:
        ctx.timeline.upstream_start = attempt.timeline.upstream_start
    ctx.attempts.append(attempt)
    return attempt


def _fail(attempt: Attempt, error: GatewayError, status: str = "error") -> GatewayError:
    # A spill is booked as an attempt that was never sent, with the pool's reason.
    attempt.status = "timeout" if isinstance(error, UpstreamTimeout) else "spilled" if isinstance(error, PoolSpill) else status
    attempt.error = error.message
    if isinstance(error, ReplicaFailed):
        attempt.replica = error.replica
    attempt.timeline.mark("end")
    return error


async def _within_deadline(ctx: RequestContext, attempt: Attempt, upstream: Upstream, what: str,
                           call: Callable[[float], Awaitable[T]]) -> T:
    """Run one upstream call given the request's remaining time, recording how it failed.
    The upstream holds the call to that time itself (its client's one timer covers the
    whole reply, streamed or not), so no timeout scope of ours runs beside it: a scope
    costs ~6 us under uvloop, on every call."""
    try:
        return await call(remaining_s(ctx))
    except TimeoutError:
        raise _fail(attempt, UpstreamTimeout(f"upstream `{upstream.name}` did not {what} before the request deadline")) from None
    except GatewayError as exc:
        raise _fail(attempt, exc) from None
    except asyncio.CancelledError:
        _fail(attempt, UpstreamError("the client went away"), status="cancelled")
        raise


def _note_reply(attempt: Attempt, status: int, replica: str, headers: dict[str, str]) -> None:
    attempt.http_status = status
    attempt.replica = replica
    attempt.provider_request_id = headers.get("x-request-id")
    attempt.limit_headers = limit_headers(headers)


async def send_once(
    ctx: RequestContext, upstream: Upstream, target: ModelTarget, payload: bytes, pool: PoolRequest | None = None
) -> tuple[Attempt, Answer]:
    """The attempt, and the parsed upstream body with its raw bytes (passed to the client as-is)."""
    attempt = _new_attempt(ctx, target)
    reply = await _within_deadline(ctx, attempt, upstream, "answer", lambda t: upstream.send(ctx.path, payload, t, pool))
    _note_reply(attempt, reply.status, reply.replica, reply.headers)
    attempt.timeline.mark("end")
    if reply.status != 200:
        raise _fail(attempt, error_from_reply(upstream.name, reply.status, reply.headers, reply.body, upstream.secrets))
    try:
        body = orjson.loads(reply.body)
        if not isinstance(body, dict):
            raise ValueError("not an object")
    except (orjson.JSONDecodeError, ValueError):
        raise _fail(attempt, UpstreamError(f"upstream `{upstream.name}` sent a malformed response (not a JSON object)")) from None
    usage = body.get("usage")
    if isinstance(usage, dict):
        attempt.usage = messages.usage_of(usage) if ctx.endpoint == messages.MESSAGES else Usage.from_openai(usage)
    attempt.status = "ok"
    attempt.timeline.first_token = attempt.timeline.last_token = attempt.timeline.end
    return attempt, (body, reply.body)


async def open_stream(ctx: RequestContext, upstream: Upstream, target: ModelTarget, payload: bytes,
                      pool: PoolRequest | None = None) -> tuple[Attempt, UpstreamStream]:
    attempt = _new_attempt(ctx, target)
    stream = await _within_deadline(ctx, attempt, upstream, "start answering",
                                    lambda t: upstream.open_stream(ctx.path, payload, t, pool))
    _note_reply(attempt, stream.status, stream.replica, stream.headers)
    if stream.status != 200:
        try:
            body = await _read_bounded(stream)
        finally:
            await stream.aclose()
        raise _fail(attempt, error_from_reply(upstream.name, stream.status, stream.headers, body, upstream.secrets))
    return attempt, stream


async def _read_bounded(stream: UpstreamStream) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in stream.aiter_raw():
        parts.append(chunk)
        size += len(chunk)
        if size > MAX_ERROR_BODY:
            break
    return b"".join(parts)


def openai_error_event(message: str, code: str) -> bytes:
    # The openai SDK raises APIError on an event carrying `error`, so a cut stream is
    # noticed by the client instead of looking like a short answer.
    return data_event({"error": {"message": message, "type": "upstream_error", "param": None, "code": code}})


def _anthropic_error_event(message: str, code: str) -> bytes:
    return anthropic_stream.error_event(message, "timeout_error" if code == "upstream_timeout" else "api_error")


async def relay_stream(
    ctx: RequestContext,
    attempt: Attempt,
    stream: UpstreamStream,
    finish: Callable[[RequestContext], Awaitable[None]],
    keep: bytearray | None = None,
    before_done: Callable[[], Awaitable[None]] | None = None,
    *,
    only_call_in_flight: Callable[[], bool],
    secrets: tuple[str, ...] = (),
) -> AsyncIterator[bytes]:
    """Relay upstream events as they complete (OpenAI's SSE chunks, or Anthropic's
    events on the Messages API). `keep` collects them (up to a bound) and
    `before_done` runs once the answer is complete but before the client sees [DONE],
    so a cached copy exists by the time the client can ask again. `only_call_in_flight`: whether this
    is the only call in flight (see below)."""
    relay: SseRelay | anthropic_stream.AnthropicEventRelay
    if ctx.endpoint == messages.MESSAGES:
        relay = anthropic_stream.AnthropicEventRelay(stream.max_event_bytes, secrets)
        error_event = _anthropic_error_event
    else:
        relay = SseRelay(strip_usage_chunk=not ctx.client_wants_usage, max_event_bytes=stream.max_event_bytes,
                         secrets=secrets)
        error_event = openai_error_event
    timeline = attempt.timeline
    # What reached the client (bounded), so that a stream cut short is booked at what it produced.
    relayed: list[bytes] = []
    relayed_bytes = 0
    # The upstream holds the stream to the deadline it was opened with (one timer for
    # the whole stream): past it, it drops the connection and the read below says so.
    expired = False
    try:
        try:
            async for chunk in stream.aiter_raw():
                out = relay.feed(chunk)
                if not out:
                    continue
                if relayed_bytes < MAX_KEPT_BYTES:
                    relayed.append(out)
                    relayed_bytes += len(out)
                if timeline.first_token is None:
                    timeline.first_token = time.monotonic()
                    ctx.timeline.first_token = ctx.timeline.first_token or timeline.first_token
                timeline.last_token = time.monotonic()
                if keep is not None:
                    if len(keep) + len(out) > MAX_KEPT_BYTES:
                        keep.clear()  # too big to cache: the caller finds nothing to store
                        keep = None
                    else:
                        keep += out
                if relay.done and len(out) > len(DONE_EVENT) and out.endswith(DONE_EVENT) and only_call_in_flight():
                    # The answer's last events and [DONE] in one read. [DONE] waits for the
                    # reply's end (api/hot_paths.py), after the upstream's last read and this
                    # call's books; the events need not: with no other call in flight they go
                    # out now, in a write of their own. Under load, where a whole stream often
                    # comes in one read, the one write is worth more: splitting every time
                    # cost 7.8 % of streamed calls per second at c=16 on this project's machines.
                    yield out[: -len(DONE_EVENT)]
                    out = DONE_EVENT
                if relay.done and before_done is not None and relay.error is None:
                    if relay.usage is not None:
                        attempt.usage = Usage.from_openai(relay.usage)
                    hook, before_done = before_done, None
                    await hook()
                yield out
        except UpstreamReplyTooLarge as exc:
            _fail(attempt, exc, status="cut")
            if timeline.first_token is None:
                raise  # nothing has reached the client: it gets the 502 itself
            yield error_event(exc.message, exc.code or "upstream_reply_too_large")
            return
        except StreamBroken as exc:
            expired = exc.deadline
            if not expired:
                _fail(attempt, UpstreamError(f"the upstream stream broke: {exc}"), status="cut")
                yield error_event("the upstream connection broke before the answer was complete", "upstream_stream_cut")
                return
        if expired and not relay.done:
            _fail(attempt, UpstreamTimeout("the request deadline passed mid-stream"))
            yield error_event("the request deadline passed while the answer was streaming", "upstream_timeout")
            return
        if relay.usage is not None:
            attempt.usage = Usage.from_openai(relay.usage)
        if relay.done and relay.error is None:
            attempt.status = "ok"
            timeline.mark("end")
        else:
            _fail(attempt, UpstreamError("the upstream stream ended before [DONE]"), status="cut")
            if relay.error is None:
                yield error_event("the upstream ended the stream before the answer was complete", "upstream_stream_cut")
    finally:
        if attempt.status == "pending":
            attempt.status = "cancelled"
            attempt.error = "the client disconnected mid-stream"
            timeline.mark("end")
        if attempt.usage is None:
            attempt.relayed_output = relayed_text(relayed)
        # Cleanup must run even though the task is being cancelled (client gone):
        # closing the upstream response is what makes vLLM abort the work.
        with anyio.CancelScope(shield=True):
            await stream.aclose()
            await finish(ctx)
