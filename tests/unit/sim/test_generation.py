"""What the simulated model says: deterministic, bounded, stop-aware, tool-aware."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.sim.generation import GenerationSettings, SimRequestError, plan_chat, plan_completion
from gateway.sim.textgen import WORDS
from gateway.tokens.counting import count_text_tokens

SETTINGS = GenerationSettings(seed=0, default_tokens=20)
HELLO = [{"role": "user", "content": "hello"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def chat(**body: Any) -> Any:
    return plan_chat({"messages": HELLO, **body}, SETTINGS)


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_every_word_is_exactly_one_token(encoding: str) -> None:
    assert all(count_text_tokens(word, encoding) == 1 for word in WORDS)
    [plan] = chat()
    assert count_text_tokens(plan.text, encoding) == plan.completion_tokens == 20


def test_deterministic_per_messages_and_seed() -> None:
    assert chat()[0].text == chat()[0].text
    assert chat()[0].text != plan_chat({"messages": [{"role": "user", "content": "other"}]}, SETTINGS)[0].text
    assert chat(seed=1)[0].text != chat(seed=2)[0].text
    assert plan_chat({"messages": HELLO}, GenerationSettings(seed=5, default_tokens=20))[0].text != chat()[0].text


def test_n_choices_differ() -> None:
    plans = chat(n=3)
    assert [p.index for p in plans] == [0, 1, 2]
    assert len({p.text for p in plans}) == 3


def test_bounds_and_finish_reasons() -> None:
    assert (chat()[0].finish_reason, chat()[0].completion_tokens) == ("stop", 20)
    short = chat(max_tokens=5)[0]
    assert (short.finish_reason, short.completion_tokens) == ("length", 5)
    roomy = chat(max_completion_tokens=50)[0]
    assert (roomy.finish_reason, roomy.completion_tokens) == ("stop", 20)
    forced = chat(max_tokens=50, ignore_eos=True)[0]
    assert (forced.finish_reason, forced.completion_tokens) == ("length", 50)
    assert chat(min_tokens=30)[0].completion_tokens == 30


def test_stop_sequence_truncates_text() -> None:
    text = chat()[0].text
    word = text.split()[5]
    stopped = chat(stop=[" " + word, "zzz"])[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[: text.index(" " + word)]
    assert stopped.completion_tokens == 6  # the word that hit the stop was still generated


def test_json_schema_and_truncated_json() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    plan = chat(response_format=fmt)[0]
    assert isinstance(json.loads(plan.text)["name"], str)
    assert plan.completion_tokens == count_text_tokens(plan.text)
    cut = chat(response_format=fmt, max_tokens=2)[0]
    assert cut.finish_reason == "length" and cut.completion_tokens == 2


def test_tool_call_unless_answering_a_tool_result() -> None:
    plan = chat(tools=[WEATHER_TOOL])[0]
    assert plan.finish_reason == "tool_calls" and plan.tool_call is not None
    assert plan.tool_call.name == "get_weather" and plan.tool_call.id.startswith("call_")
    assert "city" in json.loads(plan.text)
    after = plan_chat({"tools": [WEATHER_TOOL], "messages": [*HELLO, {"role": "tool", "tool_call_id": "c", "content": "21C"}]}, SETTINGS)
    assert after[0].tool_call is None and after[0].finish_reason == "stop"
    assert chat(tools=[WEATHER_TOOL], tool_choice="none")[0].tool_call is None


def test_named_tool_choice() -> None:
    other = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    named = {"type": "function", "function": {"name": "lookup"}}
    assert chat(tools=[WEATHER_TOOL, other], tool_choice=named)[0].tool_call.name == "lookup"
    with pytest.raises(SimRequestError):
        chat(tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "missing"}})


@pytest.mark.parametrize("body", [{"messages": []}, {"messages": "hi"}, {}, {"messages": HELLO, "n": 0},
                                  {"messages": HELLO, "max_tokens": -1}, {"messages": HELLO, "stop": 5}])
def test_invalid_requests(body: dict[str, Any]) -> None:
    with pytest.raises(SimRequestError):
        plan_chat(body, SETTINGS)


def test_completion_plans_per_prompt_and_n() -> None:
    plans = plan_completion({"n": 2}, ["one", "two"], SETTINGS)
    assert [p.index for p in plans] == [0, 1, 2, 3]
    assert plans[0].text != plans[2].text
