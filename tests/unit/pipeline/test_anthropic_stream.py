"""Anthropic's streamed events pass through byte for byte while the relay notes the
usage (input and cache from message_start, output from message_delta) and the end."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import UpstreamReplyTooLarge
from gateway.pipeline.anthropic_stream import AnthropicEventRelay
from gateway.pipeline.usage_estimate import relayed_text


def event(name: str, payload: dict[str, object]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **payload}) + b"\n\n"


START = event("message_start", {"message": {"id": "msg_1", "usage": {"input_tokens": 12, "cache_read_input_tokens": 2000,
                                                                   "cache_creation_input_tokens": 0, "output_tokens": 1}}})
DELTAS = [event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
          event("ping", {}),
          event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Net thirty"}}),
          event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": " days."}}),
          event("content_block_stop", {"index": 0})]
END = [event("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
       event("message_stop", {})]
WHOLE = START + b"".join(DELTAS) + b"".join(END)


@pytest.mark.parametrize("size", [1, 7, 64, len(WHOLE)])
def test_events_pass_untouched_and_usage_is_start_plus_delta(size: int) -> None:
    relay = AnthropicEventRelay()
    out = b"".join(relay.feed(WHOLE[i : i + size]) for i in range(0, len(WHOLE), size))
    assert out == WHOLE
    assert relay.done and relay.error is None
    assert relay.usage is not None
    assert (relay.usage["prompt_tokens"], relay.usage["prompt_tokens_details"]["cached_tokens"],
            relay.usage["completion_tokens"]) == (2012, 2000, 4)
    assert relayed_text([out]) == "Net thirty days."


def test_a_stream_cut_before_message_delta_has_no_usage_to_book() -> None:
    relay = AnthropicEventRelay()
    relay.feed(START + b"".join(DELTAS))
    assert relay.usage is None and not relay.done


def test_an_error_event_is_relayed_with_its_secrets_scrubbed() -> None:
    relay = AnthropicEventRelay(secrets=("sk-ant-secret",))
    out = relay.feed(event("error", {"error": {"type": "overloaded_error", "message": "key sk-ant-secret overloaded"}}))
    assert b"sk-ant-secret" not in out and out.startswith(b"event: error\ndata: ")
    assert relay.error is not None and relay.error["type"] == "overloaded_error"


def test_an_event_that_never_ends_is_bounded() -> None:
    relay = AnthropicEventRelay(max_event_bytes=1024)
    with pytest.raises(UpstreamReplyTooLarge):
        relay.feed(b"event: content_block_delta\ndata: " + b"x" * 2048)
