"""The Responses API through the real openai SDK: `client.responses.create / stream /
parse / retrieve / delete / input_items.list` against a gateway in front of the
simulators, which serve only Chat Completions (the gateway translates)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.e2e.conftest import sim_stats
from tests.support.stack import Stack

WEATHER: list[Any] = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def client(stack: Stack, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.gateway, api_key=key or stack.key, max_retries=0, timeout=20)


def upstream_messages(stack: Stack) -> list[dict[str, Any]]:
    body = sim_stats(stack.hosted)["last_body"]
    assert isinstance(body, dict)
    messages: list[dict[str, Any]] = body["messages"]
    return messages


def test_text_answer_with_usage_cost_and_instructions(stack: Stack) -> None:
    raw = client(stack).responses.with_raw_response.create(model="gpt-4o-mini", instructions="Be brief.", input="Say hello")
    reply = raw.parse()
    assert reply.object == "response" and reply.id.startswith("resp_") and reply.status == "completed"
    assert reply.output_text and reply.output[0].type == "message"
    assert reply.usage is not None and reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert reply.usage.input_tokens_details.cached_tokens >= 0
    usage, cached = reply.usage, reply.usage.input_tokens_details.cached_tokens
    expected = (Decimal(usage.input_tokens - cached) * Decimal("0.15") + Decimal(cached) * Decimal("0.075")
                + Decimal(usage.output_tokens) * Decimal("0.60")) / 1_000_000
    assert Decimal(raw.headers["x-gateway-cost-usd"]) == expected  # the chat prices, to the last digit
    assert raw.headers["x-gateway-model"] == "gpt-4o-mini"
    assert upstream_messages(stack) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]


def test_streamed_text_equals_non_streamed(stack: Stack) -> None:
    c = client(stack)
    whole = c.responses.create(model="gpt-4o-mini", input="Say hello to the gateway")
    with c.responses.stream(model="gpt-4o-mini", input="Say hello to the gateway") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == whole.output_text
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert "response.output_text.delta" in kinds
    assert final.usage is not None and final.usage.output_tokens > 0
    # A streamed response is stored too, as it was streamed.
    assert c.responses.retrieve(final.id).output_text == whole.output_text


def test_max_output_tokens_gives_incomplete(stack: Stack) -> None:
    reply = client(stack).responses.create(model="gpt-4o-mini", input="Tell me a long story", max_output_tokens=4)
    assert reply.status == "incomplete"
    assert reply.incomplete_details is not None and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage is not None and reply.usage.output_tokens == 4


class Person(BaseModel):
    name: str
    age: int


def test_structured_output_through_parse(stack: Stack) -> None:
    reply = client(stack).responses.parse(model="gpt-4o-mini", input="Invent a person", text_format=Person)
    assert isinstance(reply.output_parsed, Person)
    json_object = client(stack).responses.create(model="gpt-4o-mini", input="Give JSON",
                                                 text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(json_object.output_text), dict)


def test_function_call_round_trip_with_previous_response_id(stack: Stack) -> None:
    c = client(stack)
    first = c.responses.create(model="gpt-4o-mini", input="Weather in Paris?", tools=WEATHER)
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and "city" in json.loads(call.arguments) and call.call_id
    second = c.responses.create(model="gpt-4o-mini", previous_response_id=first.id, tools=WEATHER,
                                input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}])
    assert second.output_text and all(item.type == "message" for item in second.output)
    sent = upstream_messages(stack)
    assert sent[0] == {"role": "user", "content": "Weather in Paris?"}
    assert sent[1]["role"] == "assistant" and sent[1]["tool_calls"][0]["id"] == call.call_id
    assert sent[2] == {"role": "tool", "tool_call_id": call.call_id, "content": '{"temp_c": 21}'}


def test_streamed_function_call_matches(stack: Stack) -> None:
    c = client(stack)
    with c.responses.stream(model="gpt-4o-mini", input="Weather in Paris?", tools=WEATHER) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    call = next(item for item in final.output if item.type == "function_call")
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds


def test_three_turns_send_every_earlier_turn(stack: Stack) -> None:
    c = client(stack)
    one = c.responses.create(model="gpt-4o-mini", input="My name is Ada.")
    two = c.responses.create(model="gpt-4o-mini", input="I live in Paris.", previous_response_id=one.id)
    three = c.responses.create(model="gpt-4o-mini", input="Where do I live?", previous_response_id=two.id)
    assert upstream_messages(stack) == [
        {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": one.output_text},
        {"role": "user", "content": "I live in Paris."}, {"role": "assistant", "content": two.output_text},
        {"role": "user", "content": "Where do I live?"},
    ]
    assert three.previous_response_id == two.id
    items = c.responses.input_items.list(three.id, order="asc")
    assert [item.content[0].text for item in items.data if item.type == "message"] == ["Where do I live?"]  # type: ignore[union-attr]


def test_other_tenant_gets_404_for_every_verb(stack: Stack) -> None:
    mine = client(stack).responses.create(model="gpt-4o-mini", input="Secret plans")
    theirs = client(stack, stack.other_key)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.create(model="gpt-4o-mini", input="And then?", previous_response_id=mine.id)
    assert client(stack).responses.retrieve(mine.id).output_text == mine.output_text  # still there for its owner


def test_delete_then_404_and_store_false_is_not_kept(stack: Stack) -> None:
    c = client(stack)
    reply = c.responses.create(model="gpt-4o-mini", input="Hello")
    c.responses.delete(reply.id)
    for verb in (c.responses.retrieve, c.responses.delete, c.responses.input_items.list):
        with pytest.raises(openai.NotFoundError):
            verb(reply.id)  # type: ignore[operator]
    unstored = c.responses.create(model="gpt-4o-mini", input="Hello", store=False)
    assert unstored.output_text
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "gpt-4o-mini"}, "input"),
    ({"model": "gpt-4o-mini", "input": 7}, "input"),
    ({"model": "gpt-4o-mini", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"model": "gpt-4o-mini", "input": "hi", "background": True}, "background"),
    ({"model": "gpt-4o-mini", "input": "hi", "conversation": "conv_1"}, "conversation"),
    ({"model": "gpt-4o-mini", "input": [{"type": "reasoning"}]}, "input[0].type"),
    ({"model": "gpt-4o-mini", "input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format"),
    ({"model": "gpt-4o-mini", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
])
def test_bad_input_is_a_precise_400(stack: Stack, body: dict[str, Any], param: str) -> None:
    reply = httpx.post(f"{stack.gateway}/responses", json=body, headers={"authorization": f"Bearer {stack.key}"}, timeout=10)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_unknown_model_and_bad_key(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError):
        client(stack).responses.create(model="no-such-model", input="hi")
    with pytest.raises(openai.AuthenticationError):
        client(stack, "sk-wrong").responses.create(model="gpt-4o-mini", input="hi")
