from __future__ import annotations

import orjson
import pytest

from gateway.errors import UpstreamReplyTooLarge
from gateway.upstreams.sse import SseRelay


def chunk(payload: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


CONTENT = chunk({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}], "usage": None})
FINISH = chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": None})
USAGE = chunk({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})
DONE = b"data: [DONE]\n\n"


def test_usage_chunk_is_read_and_stripped_when_client_did_not_ask() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    out = relay.feed(CONTENT + FINISH + USAGE + DONE)
    assert out == CONTENT + FINISH + DONE
    assert relay.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert relay.finish_reason == "stop" and relay.done


def test_usage_chunk_is_kept_when_client_asked() -> None:
    relay = SseRelay(strip_usage_chunk=False)
    assert relay.feed(CONTENT + USAGE + DONE) == CONTENT + USAGE + DONE


def test_events_split_across_reads_are_forwarded_whole_and_in_order() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    stream = CONTENT + CONTENT + FINISH + USAGE + DONE
    forwarded = b"".join(relay.feed(stream[i : i + 7]) for i in range(0, len(stream), 7))
    assert forwarded == CONTENT + CONTENT + FINISH + DONE
    assert relay.usage is not None and relay.done


def test_crlf_framing_is_understood() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    out = relay.feed((CONTENT + USAGE + DONE).replace(b"\n", b"\r\n"))
    assert out == CONTENT + DONE
    assert relay.usage is not None


def test_spaced_json_finish_reason_is_seen() -> None:
    relay = SseRelay(strip_usage_chunk=True)
    relay.feed(b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}\n\n')
    assert relay.finish_reason == "length"


def test_content_that_quotes_usage_is_forwarded_and_not_taken_for_usage() -> None:
    """A model may write about `"usage": {...}` in its answer: escaped inside the
    content string, it must neither set the relay's usage nor be stripped."""
    tricky = chunk({"choices": [{"index": 0, "delta": {"content": 'say "usage": {"prompt_tokens": 1} and "error"'},
                                 "finish_reason": None}], "usage": None})
    relay = SseRelay(strip_usage_chunk=True)
    assert relay.feed(tricky + CONTENT) == tricky + CONTENT
    assert relay.usage is None and relay.error is None and not relay.done
    assert relay.feed(FINISH + USAGE + DONE) == FINISH + DONE
    assert relay.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_a_read_holding_a_whole_stream_is_forwarded_whole_with_its_usage_read() -> None:
    """Under load one read can hold a whole stream: its content passes untouched, and its
    finish, usage and end are still seen."""
    relay = SseRelay(strip_usage_chunk=True)
    assert relay.feed(CONTENT * 20 + FINISH + USAGE + DONE) == CONTENT * 20 + FINISH + DONE
    assert relay.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert relay.finish_reason == "stop" and relay.done and relay.events == 23


def test_a_finish_before_the_tail_of_a_whole_stream_is_seen() -> None:
    """With n=2 one choice can finish while the other still streams: that event is not
    among the last three, and is read all the same."""
    early = chunk({"choices": [{"index": 1, "delta": {}, "finish_reason": "length"}], "usage": None})
    relay = SseRelay(strip_usage_chunk=False)
    stream = CONTENT * 3 + early + CONTENT * 5 + USAGE + DONE
    assert relay.feed(stream) == stream
    assert relay.finish_reason == "length" and relay.usage is not None and relay.events == 11


def test_an_event_that_never_ends_is_refused_at_its_bound() -> None:
    relay = SseRelay(strip_usage_chunk=False, max_event_bytes=4096)
    assert relay.feed(b'data: {"a":1}\n\ndata: ') == b'data: {"a":1}\n\n'
    with pytest.raises(UpstreamReplyTooLarge):
        for _ in range(10):
            relay.feed(b"x" * 1024)  # no blank line, ever


def test_events_up_to_the_bound_pass() -> None:
    relay = SseRelay(strip_usage_chunk=False, max_event_bytes=4096)
    event = b"data: " + b"x" * 4000 + b"\n\n"
    assert relay.feed(event[:2000]) == b""
    assert relay.feed(event[2000:]) == event


def test_an_error_event_reaches_the_client_without_internal_addresses_or_secrets() -> None:
    relay = SseRelay(strip_usage_chunk=False, secrets=("sk-upstream-secret",))
    event = chunk({"error": {"message": "backend http://10.1.2.3:8000/v1 refused key sk-upstream-secret", "type": "server_error"}})
    out = relay.feed(event)
    assert b"10.1.2.3" not in out and b"sk-upstream-secret" not in out and b"server_error" in out
    assert relay.error is not None and "10.1.2.3" not in relay.error["message"]
