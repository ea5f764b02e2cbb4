"""A stream's relay: when an answer's last events come in one read with [DONE], they
reach the client at once when the call is the only one in flight, and with [DONE] under load."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

from gateway.caching.replay import DONE_EVENT
from gateway.pipeline.forward import relay_stream
from gateway.request_context import Attempt, RequestContext
from gateway.routing.resolved import ModelTarget, RuntimePolicy
from gateway.telemetry.timeline import Timeline

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'
LAST = b'data: {"choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}\n\n'
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'


class Upstream:
    """An upstream stream that hands over its reads as given."""

    def __init__(self, *reads: bytes) -> None:
        self.status, self.headers, self.replica = 200, {"content-type": "text/event-stream"}, "http://upstream"
        self.max_event_bytes = 1024 * 1024
        self.reads = reads
        self.closed = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for read in self.reads:
            yield read

    async def aclose(self) -> None:
        self.closed = True


def _relay(upstream: Upstream, *, only_call_in_flight: bool) -> tuple[list[bytes], list[str]]:
    """What the relay yields, and the order of what the client and the hooks saw."""
    ctx = RequestContext(request_id="req_1", endpoint="chat.completions", path="/chat/completions",
                         policy=cast(RuntimePolicy, None))
    attempt = Attempt(target=cast(ModelTarget, None), timeline=Timeline())
    seen: list[str] = []

    async def finish(_: RequestContext) -> None:
        seen.append("finish")

    async def before_done() -> None:
        seen.append("cached")

    async def run() -> list[bytes]:
        out = []
        async for chunk in relay_stream(ctx, attempt, upstream, finish, bytearray(), before_done, only_call_in_flight=lambda: only_call_in_flight):
            out.append(chunk)
            seen.append("done" if chunk.endswith(DONE_EVENT) else "events")
        return out

    out = asyncio.run(run())
    assert attempt.status == "ok" and upstream.closed
    return out, seen


def test_the_only_call_in_flight_sends_its_last_events_before_done_and_the_books() -> None:
    out, seen = _relay(Upstream(ROLE, LAST + FINISH + DONE_EVENT), only_call_in_flight=True)
    assert out == [ROLE, LAST + FINISH, DONE_EVENT]
    # the cached copy is stored before the client can see [DONE], as before
    assert seen == ["events", "events", "cached", "done", "finish"]


def test_under_load_the_last_events_go_with_done_in_one_piece() -> None:
    out, seen = _relay(Upstream(ROLE, LAST + FINISH + DONE_EVENT), only_call_in_flight=False)
    assert out == [ROLE, LAST + FINISH + DONE_EVENT]
    assert seen == ["events", "cached", "done", "finish"]


def test_done_alone_in_its_read_is_not_split() -> None:
    out, _ = _relay(Upstream(ROLE + LAST, FINISH, DONE_EVENT), only_call_in_flight=True)
    assert out == [ROLE + LAST, FINISH, DONE_EVENT]
