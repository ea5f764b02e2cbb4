"""Responses-API requests as chat requests, and chat streams as Responses events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.pipeline.responses_stream import ResponseStreamTranslator, translated
from gateway.pipeline.responses_translate import chat_body, check_request, from_chat_completion, input_items


def test_items_become_chat_turns_with_calls_grouped() -> None:
    body = {"model": "m", "instructions": "Be brief.", "input": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "21"},
        {"type": "function_call_output", "call_id": "c2", "output": "25"},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Celsius."}]},
    ], "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "w"}, "max_output_tokens": 50,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}}}
    check_request(body)
    chat = chat_body(body, input_items(body))
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "w", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21"},
        {"role": "tool", "tool_call_id": "c2", "content": "25"},
        {"role": "system", "content": "Celsius."},
    ]
    assert chat["tools"] == [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert chat["max_completion_tokens"] == 50
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True}}


@pytest.mark.parametrize("body", [{"model": "m", "input": "x", "frequency_penalty": 1},
                                  {"model": "m", "input": "x", "truncation": "auto"},
                                  {"model": "m", "input": "x", "store": "yes"}])
def test_what_cannot_be_served_is_refused(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        check_request(body)


def test_a_completion_becomes_output_items_and_usage() -> None:
    completion = {"choices": [{"finish_reason": "length", "message": {"content": "Hi", "tool_calls": [
        {"id": "c1", "function": {"name": "w", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}}
    response = from_chat_completion("resp_1", {"model": "m"}, completion, "m")
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    assert response["output"][1]["call_id"] == "c1"
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3,
                                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 13}


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e.split(b"data: ", 1)[1]) for e in raw.split(b"\n\n") if e]


def test_a_cut_chat_stream_ends_failed_and_is_not_stored() -> None:
    stored: list[dict[str, Any]] = []

    async def keep(response: dict[str, Any]) -> None:
        stored.append(response)

    async def chat() -> AsyncIterator[bytes]:
        yield b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
        yield b'data: {"error":{"message":"cut","code":"upstream_stream_cut"}}\n\n'

    async def run() -> bytes:
        return b"".join([c async for c in translated(chat(), ResponseStreamTranslator("resp_1", {"model": "m"}, "m", keep))])

    events = _events(asyncio.run(run()))
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["error"]["code"] == "upstream_stream_cut"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert stored == []
