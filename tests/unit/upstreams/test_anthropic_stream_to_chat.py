"""Anthropic's streamed events -> chat completion chunks, alone."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.upstreams.anthropic_stream_to_chat import AnthropicToChatChunks


def _events(*payloads: dict[str, Any]) -> bytes:
    return b"".join(b"event: " + p["type"].encode() + b"\ndata: " + orjson.dumps(p) + b"\n\n" for p in payloads)


STREAM = _events(
    {"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {
        "input_tokens": 10, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 5, "output_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}},
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"a":1}'}},
    {"type": "content_block_stop", "index": 2},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}},
    {"type": "message_stop"},
)


def _chunks(raw: bytes) -> list[Any]:
    return [orjson.loads(e.removeprefix(b"data: ")) if e != b"data: [DONE]" else "[DONE]" for e in raw.split(b"\n\n") if e]


def test_each_event_becomes_its_chunk_and_usage_comes_last() -> None:
    chunks = _chunks(AnthropicToChatChunks(1700000000, include_usage=True).feed(STREAM))
    assert [c["choices"][0]["delta"] for c in chunks[:4]] == [
        {"role": "assistant", "content": ""}, {"content": "Hi"},
        {"tool_calls": [{"index": 0, "id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":1}'}}]}]
    assert chunks[4]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[0]["id"] == "chatcmpl-1" and chunks[0]["model"] == "claude" and chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[5]["choices"] == [] and chunks[5]["usage"] == {
        "prompt_tokens": 115, "completion_tokens": 7, "total_tokens": 122,
        "prompt_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 5}}
    assert chunks[6:] == ["[DONE]"]


def test_no_usage_chunk_unless_asked() -> None:
    chunks = _chunks(AnthropicToChatChunks(0, include_usage=False).feed(STREAM))
    assert all(c == "[DONE]" or c["choices"] for c in chunks)


def test_an_error_event_is_an_error_chunk_and_no_done() -> None:
    raw = _events({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert _chunks(AnthropicToChatChunks(0, include_usage=True).feed(raw)) == [
        {"error": {"message": "Overloaded", "type": "overloaded_error", "param": None, "code": None}}]
