from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.caching.replay import DONE_EVENT, completion_from_stream, stream_from_completion
from gateway.sim.generation import ChoicePlan, ToolCallPlan
from gateway.sim.hosted_inference import DIALECT
from gateway.sim.shapes import chat_stream_steps, completion_stream_steps, usage_chunk

USAGE = {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21, "prompt_tokens_details": {"cached_tokens": 0}}
HEADER = {"id": "chatcmpl-abc", "created": 1_780_000_000, "model": "gpt-4o-mini-2024-07-18"}


def chat(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-abc", "object": "chat.completion", "created": 1_780_000_000, "model": "gpt-4o-mini-2024-07-18",
            "system_fingerprint": "fp_1", "choices": choices, "usage": USAGE, **extra}


def text_choice(index: int, content: str, finish: str = "stop") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    return {"index": index, "message": message, "logprobs": None, "finish_reason": finish}


def tool_choice(index: int, calls: list[tuple[str, str, str]]) -> dict[str, Any]:
    tool_calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]
    message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": tool_calls}
    return {"index": index, "message": message, "logprobs": None, "finish_reason": "tool_calls"}


def payloads(events: list[bytes]) -> list[dict[str, Any]]:
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)
    assert events[-1] == DONE_EVENT
    return [orjson.loads(e[6:]) for e in events[:-1]]


LONG_ARGS = '{"query": "' + "weather in Lisbon and Porto " * 6 + '", "units": "metric"}'
MULTI = chat([
    text_choice(0, "  Hello there,\nworld! Ünïcödé  ok  "),
    tool_choice(1, [("call_1", "get_weather", LONG_ARGS), ("call_2", "get_time", '{"tz": "Europe/Lisbon"}')]),
    text_choice(2, "", finish="length"),
])


def test_round_trip_keeps_everything_for_several_choices_and_tool_calls() -> None:
    assert completion_from_stream(stream_from_completion(MULTI, include_usage=True)) == MULTI


def test_without_include_usage_no_usage_chunk_is_sent() -> None:
    events = stream_from_completion(MULTI, include_usage=False)
    assert all("usage" not in p for p in payloads(events))
    rebuilt = completion_from_stream(events)
    assert rebuilt is not None and "usage" not in rebuilt
    assert rebuilt == {k: v for k, v in MULTI.items() if k != "usage"}


def test_with_include_usage_the_last_chunk_before_done_carries_only_usage() -> None:
    chunks = payloads(stream_from_completion(MULTI, include_usage=True))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == USAGE
    assert all(c["usage"] is None for c in chunks[:-1])


def test_chunks_look_like_openai_chunks() -> None:
    chunks = payloads(stream_from_completion(MULTI, include_usage=False))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {(c["id"], c["created"], c["model"], c["system_fingerprint"]) for c in chunks} == {
        ("chatcmpl-abc", 1_780_000_000, "gpt-4o-mini-2024-07-18", "fp_1")}
    first = [c for c in chunks if c["choices"][0]["index"] == 0]
    assert first[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None, "annotations": []}
    pieces = [c["choices"][0]["delta"]["content"] for c in first[1:-1]]
    assert len(pieces) > 3 and "".join(pieces) == MULTI["choices"][0]["message"]["content"]
    assert first[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert calls[0] == {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    assert sum(1 for c in calls if c["index"] == 0) > 2  # long arguments arrive in several pieces


def test_logprobs_survive_the_round_trip() -> None:
    logprobs = {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []},
                            {"token": "!", "logprob": -0.2, "bytes": [33], "top_logprobs": []}], "refusal": None}
    body = chat([{**text_choice(0, "Hi!"), "logprobs": logprobs}])
    assert completion_from_stream(stream_from_completion(body, include_usage=True)) == body


def test_vendor_extras_on_choices_and_messages_survive() -> None:
    choice = text_choice(0, "thinking done")
    choice["stop_reason"] = None
    choice["message"]["reasoning_content"] = "Let me think step by step."
    body = chat([choice], service_tier="default")
    assert completion_from_stream(stream_from_completion(body, include_usage=True)) == body


def text_completion(choices: list[tuple[int, str, str]]) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion", "created": 1_780_000_000, "model": "llama-3-8b",
            "choices": [{"index": i, "text": t, "logprobs": None, "finish_reason": f} for i, t, f in choices], "usage": USAGE}


def test_text_completion_round_trip() -> None:
    body = text_completion([(0, " once upon a time,\n there was", "length"), (1, " a cat.", "stop")])
    events = stream_from_completion(body, include_usage=True)
    assert {p["object"] for p in payloads(events)} == {"text_completion"}
    assert completion_from_stream(events) == body


def test_rebuilds_a_simulated_provider_stream_with_interleaved_choices() -> None:
    plans = [
        ChoicePlan(0, ["The", " answer", " is", " 4", "."], "stop"),
        ChoicePlan(1, ['{"a"', ': 1', ', "b": 2}'], "tool_calls", ToolCallPlan("call_x", "add")),
    ]
    header = {**HEADER, "system_fingerprint": "fp_sim"}
    chunks = [step.chunk for step in chat_stream_steps(header, plans, DIALECT)]
    chunks.append(usage_chunk(header, "chat.completion.chunk", USAGE))
    # several events per read, CRLF line endings and a keep-alive comment, as relays forward them
    events = [b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks]
    half = len(events) // 2
    reads = [b": keep-alive\n\n" + b"".join(events[:half]), b"".join(events[half:]), DONE_EVENT]
    rebuilt = completion_from_stream(reads)
    assert rebuilt is not None
    assert rebuilt["object"] == "chat.completion" and rebuilt["id"] == "chatcmpl-abc" and rebuilt["usage"] == USAGE
    first, second = rebuilt["choices"]
    assert first["message"]["content"] == "The answer is 4." and first["finish_reason"] == "stop"
    assert second["message"]["content"] is None and second["finish_reason"] == "tool_calls"
    assert second["message"]["tool_calls"] == [
        {"id": "call_x", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]


def test_rebuilds_a_simulated_text_completion_stream() -> None:
    plans = [ChoicePlan(0, ["Once", " upon"], "length")]
    events = [b"data: " + orjson.dumps(s.chunk) + b"\n\n" for s in completion_stream_steps(HEADER, plans, DIALECT)]
    rebuilt = completion_from_stream([*events, DONE_EVENT])
    assert rebuilt is not None and rebuilt["object"] == "text_completion"
    assert rebuilt["choices"] == [{"index": 0, "text": "Once upon", "logprobs": None, "finish_reason": "length"}]


@pytest.mark.parametrize("cut", ["no_done", "no_finish", "error", "bad_json", "nothing"])
def test_an_incomplete_or_failed_stream_is_not_a_completion(cut: str) -> None:
    events = stream_from_completion(MULTI, include_usage=True)
    if cut == "no_done":
        events = events[:-1]
    elif cut == "no_finish":
        events = [e for e in events if b'"finish_reason":"length"' not in e]
    elif cut == "error":
        events = [*events[:3], b'data: {"error": {"message": "upstream broke"}}\n\n', DONE_EVENT]
    elif cut == "bad_json":
        events = [events[0], b"data: {not json\n\n", *events[1:]]
    else:
        events = [DONE_EVENT]
    assert completion_from_stream(events) is None
