"""What a streamed reply sends: each event as it comes, the `[DONE]` event with the
body's end in one message (one write to the client's socket), and an error with its
own status when the upstream fails before the first event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from gateway.api.hot_paths import stream
from gateway.caching.replay import DONE_EVENT, stream_from_completion
from gateway.errors import UpstreamReplyTooLarge
from gateway.pipeline.runner import StreamReply, _replay

FIRST = b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n'
SECOND = b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n'
CUT = b'data: {"error":{"message":"the upstream connection broke"}}\n\n'


class Recorder:
    """The ASGI side of one response: every message sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def bodies(self) -> list[tuple[bytes, bool]]:
        return [(m["body"], m.get("more_body", False)) for m in self.sent if m["type"] == "http.response.body"]


async def _events(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _relay(*chunks: bytes) -> list[tuple[bytes, bool]]:
    client = Recorder()
    asyncio.run(stream(StreamReply(_events(*chunks)), client.send))
    assert client.sent[0]["type"] == "http.response.start"
    return client.bodies()


def test_events_go_out_as_they_come_and_done_goes_with_the_end_of_the_body() -> None:
    assert _relay(FIRST, SECOND, DONE_EVENT) == [(FIRST, True), (SECOND, True), (DONE_EVENT, False)]


def test_a_read_that_ends_with_done_goes_out_whole_with_the_end() -> None:
    assert _relay(FIRST, SECOND + DONE_EVENT) == [(FIRST, True), (SECOND + DONE_EVENT, False)]


def test_what_follows_done_still_goes_out_after_it() -> None:
    assert _relay(FIRST, DONE_EVENT, CUT) == [(FIRST, True), (DONE_EVENT, True), (CUT, True), (b"", False)]


def test_a_stream_cut_before_done_ends_after_its_last_event() -> None:
    assert _relay(FIRST, CUT) == [(FIRST, True), (CUT, True), (b"", False)]


def test_a_stored_answer_replays_in_one_message() -> None:
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, how are you"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}}
    events = stream_from_completion(body, include_usage=True)
    assert len(events) > 4  # split like a live stream
    client = Recorder()
    asyncio.run(stream(StreamReply(_replay(events)), client.send))
    assert client.bodies() == [(b"".join(events), False)]


async def _fails_at_once() -> AsyncIterator[bytes]:
    raise UpstreamReplyTooLarge("the upstream sent a streamed event over the gateway's bound of 1024 bytes")
    yield b""  # an async generator


def test_an_upstream_that_fails_before_its_first_event_gets_an_error_status_not_a_broken_200() -> None:
    client = Recorder()
    asyncio.run(stream(StreamReply(_fails_at_once()), client.send))
    start = client.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 502
    assert dict(start["headers"])[b"x-should-retry"] == b"false"
    assert b"upstream_reply_too_large" in client.bodies()[0][0]
