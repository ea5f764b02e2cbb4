"""LangChain drives the Responses API: `langchain_openai.ChatOpenAI(use_responses_api=True)`
against a gateway in front of the simulators, over real sockets (issue 35: "tests with the
real openai SDK and LangChain"). LangChain sends `POST /v1/responses` through the openai
SDK with its own payload: the whole history as input items, `function_call` items carrying
`fc_` ids, and so on.

Nothing here may leave the machine: LangSmith tracing is switched off, and every socket
connect to an address outside loopback fails the test."""

from __future__ import annotations

import ipaddress
import json
import operator
import socket
from collections.abc import Iterable, Iterator
from functools import reduce
from typing import Any, cast

import langsmith.utils
import openai
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.e2e.conftest import sim_stats
from tests.support.stack import Stack

TRACING_VARIABLES = ("LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING", "LANGSMITH_TRACING", "LANGSMITH_TRACING_V2",
                     "LANGCHAIN_API_KEY", "LANGSMITH_API_KEY", "LANGCHAIN_ENDPOINT", "LANGSMITH_ENDPOINT")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No LangSmith tracing, and no connection to anything but this machine's loopback."""
    for name in TRACING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    real_connect = socket.socket.connect
    outside: list[object] = []

    def loopback_only(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not ipaddress.ip_address(address[0]).is_loopback:
            outside.append(address)
            raise OSError(f"test tried to reach {address!r}: only loopback is allowed")
        real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    assert not langsmith.utils.tracing_is_enabled()
    yield
    assert not outside, f"something tried to leave the machine: {outside}"


@tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return json.dumps({"city": city, "temp_c": 21})


def chat(stack: Stack, **options: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=stack.gateway, api_key=stack.key, model="gpt-4o-mini",
                      use_responses_api=True, max_retries=0, timeout=20, **options)


def joined(chunks: Iterable[BaseMessage]) -> AIMessageChunk:
    """A stream's chunks added up, as LangChain does."""
    pieces = list(chunks)
    assert pieces and all(isinstance(piece, AIMessageChunk) for piece in pieces)
    return reduce(operator.add, cast(list[AIMessageChunk], pieces))


def upstream_messages(stack: Stack) -> list[dict[str, Any]]:
    body = sim_stats(stack.hosted)["last_body"]
    assert isinstance(body, dict)
    messages: list[dict[str, Any]] = body["messages"]
    return messages


def test_plain_invoke_returns_the_text(stack: Stack) -> None:
    reply = chat(stack).invoke("Say hello")
    assert isinstance(reply, AIMessage)
    assert reply.text and reply.text.strip()
    assert reply.response_metadata["id"].startswith("resp_")
    assert reply.response_metadata["model_name"] == "gpt-4o-mini"
    assert reply.usage_metadata is not None
    assert reply.usage_metadata["input_tokens"] > 0 and reply.usage_metadata["output_tokens"] > 0
    assert reply.usage_metadata["total_tokens"] == reply.usage_metadata["input_tokens"] + reply.usage_metadata["output_tokens"]
    assert upstream_messages(stack) == [{"role": "user", "content": "Say hello"}]


def test_system_message_and_history_reach_the_upstream(stack: Stack) -> None:
    history: list[BaseMessage] = [HumanMessage("My name is Ada.")]
    first = chat(stack).invoke(history)
    history += [first, HumanMessage("What is my name?")]
    chat(stack).invoke([("system", "Be brief."), *history])
    assert upstream_messages(stack) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.text}, {"role": "user", "content": "What is my name?"},
    ]


def test_streamed_text_equals_invoked_text(stack: Stack) -> None:
    # `ChatOpenAI(seed=...)` cannot be used in Responses mode: LangChain hands `seed` to the
    # SDK's `responses.create()`, which has no such parameter (TypeError before any request).
    # The gateway does take `seed` on /v1/responses, so it goes in the body as `extra_body`.
    model = chat(stack, temperature=0, extra_body={"seed": 7})
    whole = model.invoke("Say hello to the gateway")
    chunks = list(model.stream("Say hello to the gateway"))
    assert sum(1 for chunk in chunks if chunk.text) > 1, "the text should come in more than one delta"
    streamed = joined(chunks)
    assert streamed.text == whole.text and whole.text
    assert streamed.response_metadata["id"].startswith("resp_") and streamed.response_metadata["id"] != whole.response_metadata["id"]
    assert streamed.usage_metadata is not None and streamed.usage_metadata["output_tokens"] > 0
    sent = sim_stats(stack.hosted)["last_body"]
    assert isinstance(sent, dict) and sent["seed"] == 7 and sent["temperature"] == 0


def test_tool_call_round_trip_with_bind_tools(stack: Stack) -> None:
    model = chat(stack, temperature=0).bind_tools([get_weather])
    question = HumanMessage("Weather in Paris?")
    first = model.invoke([question])
    assert isinstance(first, AIMessage) and first.tool_calls
    call = first.tool_calls[0]
    assert call["name"] == "get_weather" and "city" in call["args"] and call["id"]
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    second = model.invoke([question, first, result])
    assert isinstance(second, AIMessage) and second.text and not second.tool_calls
    sent = upstream_messages(stack)
    assert sent[0] == {"role": "user", "content": "Weather in Paris?"}
    assert sent[1]["role"] == "assistant" and sent[1]["tool_calls"][0]["id"] == call["id"]
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == call["args"]
    assert sent[2] == {"role": "tool", "tool_call_id": call["id"], "content": result.content}


def test_streamed_tool_call_matches(stack: Stack) -> None:
    model = chat(stack, temperature=0).bind_tools([get_weather])
    streamed = joined(model.stream("Weather in Paris?"))
    assert streamed.tool_calls
    assert streamed.tool_calls[0]["name"] == "get_weather" and "city" in streamed.tool_calls[0]["args"]


def test_previous_response_id_sends_only_the_new_turn(stack: Stack) -> None:
    model = chat(stack, use_previous_response_id=True)
    question = HumanMessage("My name is Ada.")
    first = model.invoke([question])
    second = model.invoke([question, first, HumanMessage("What is my name?")])
    assert second.text
    # LangChain sent only the new message and `previous_response_id`; the gateway's store
    # supplied the earlier turn.
    stored = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0, timeout=20)
    items = stored.responses.input_items.list(second.response_metadata["id"], order="asc").data
    assert [item.type for item in items] == ["message"]
    assert stored.responses.retrieve(second.response_metadata["id"]).previous_response_id == first.response_metadata["id"]
    assert upstream_messages(stack) == [
        {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.text},
        {"role": "user", "content": "What is my name?"},
    ]
