"""Messages -> chat and chat -> Messages, as data, only_call_in_flight: what each field becomes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.upstreams.chat_stream_to_messages import ChatToMessagesEvents
from gateway.upstreams.messages_to_chat import chat_to_message, request_to_chat, usage_to_anthropic


def test_a_whole_request_maps_field_by_field() -> None:
    body: dict[str, Any] = {
        "model": "gpt", "max_tokens": 100, "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        "temperature": 0.5, "top_k": 5, "stop_sequences": ["END"], "metadata": {"user_id": "u1"},
        "thinking": {"type": "enabled", "budget_tokens": 2000}, "stream": True,
        "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                              {"type": "text", "text": "calling"},
                                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                          "content": [{"type": "text", "text": "boom"}]}]},
        ],
    }
    assert request_to_chat(body, "gpt-upstream") == {
        "model": "gpt-upstream", "max_completion_tokens": 100, "temperature": 0.5, "stream": True, "stop": ["END"], "user": "u1",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": False,
        "messages": [
            {"role": "system", "content": "A\n\nB"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
            {"role": "assistant", "content": "calling",
             "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "Error: boom"},
        ],
    }


def test_a_system_turn_mid_conversation_stays_a_system_message() -> None:
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"},
                                          {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}]}
    assert request_to_chat(body, "m")["messages"] == [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be brief."}]


def test_anthropics_own_tools_are_refused_by_name() -> None:
    with pytest.raises(InvalidRequest, match="web_search_20250305"):
        request_to_chat({"max_tokens": 5, "messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "m")


@pytest.mark.parametrize(("finish", "stop"), [("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use"),
                                              ("content_filter", "refusal")])
def test_an_answer_maps_back_with_its_stop_reason_and_usage(finish: str, stop: str) -> None:
    completion = {"id": "chatcmpl-abc", "model": "gpt", "choices": [{"index": 0, "finish_reason": finish, "message": {
        "role": "assistant", "content": "ok", "tool_calls": [{"id": "c1", "type": "function",
                                                              "function": {"name": "f", "arguments": '{"x": 2}'}}]}}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 64}}}
    assert chat_to_message(completion) == {
        "id": "msg_abc", "type": "message", "role": "assistant", "model": "gpt",
        "content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 2}}],
        "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": 36, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 64, "output_tokens": 7},
    }


def test_usage_round_trips_through_both_dialects() -> None:
    from gateway.upstreams.anthropic_translate import usage_to_openai
    anthropic = {"input_tokens": 10, "cache_creation_input_tokens": 20, "cache_read_input_tokens": 30, "output_tokens": 4}
    assert usage_to_anthropic(usage_to_openai(anthropic)) == anthropic


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for event in raw.split(b"\n\n"):
        if event:
            name, data = event.split(b"\n")
            out.append((name.removeprefix(b"event: ").decode(), orjson.loads(data.removeprefix(b"data: "))))
    return out


def test_a_chat_stream_becomes_anthropics_event_sequence() -> None:
    chunk = {"id": "chatcmpl-1", "model": "gpt"}
    raw = _sse(
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {**chunk, "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {**chunk, "choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {**chunk, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]}}]},
        {**chunk, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}}]},
        {**chunk, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {**chunk, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5}},
    )
    events = _events(ChatToMessagesEvents().feed(raw))
    assert [name for name, _ in events] == [
        "message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert events[1][1]["content_block"] == {"type": "text", "text": ""}
    assert [e[1]["delta"] for e in events[3:5]] == [{"type": "text_delta", "text": "Hel"}, {"type": "text_delta", "text": "lo"}]
    assert events[6][1] == {"type": "content_block_start", "index": 1,
                            "content_block": {"type": "tool_use", "id": "c1", "name": "f", "input": {}}}
    assert [e[1]["delta"]["partial_json"] for e in events[7:9]] == ['{"x":', "1}"]
    assert events[10][1] == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                             "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                                       "output_tokens": 5}}


def test_a_chat_stream_cut_before_done_never_says_message_stop() -> None:
    raw = b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    names = [name for name, _ in _events(ChatToMessagesEvents().feed(raw))]
    assert "message_stop" not in names and "message_delta" not in names


def test_an_error_chunk_becomes_an_error_event() -> None:
    raw = b'data: {"error":{"message":"upstream broke","type":"server_error"}}\n\n'
    assert _events(ChatToMessagesEvents().feed(raw)) == [
        ("error", {"type": "error", "error": {"type": "api_error", "message": "upstream broke"}})]
