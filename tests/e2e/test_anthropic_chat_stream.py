"""A streamed OpenAI chat call to a model on a `kind: anthropic` upstream, reached with
the real openai SDK: Anthropic's events arrive as `chat.completion.chunk`s saying what
the whole answer says, usage comes in the last chunk when the client asks for it (and
only then), tool calls stream as argument deltas, and the books hold the provider's
usage at the model's prices to the last digit."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests.support.claude import ClaudeStack, formula, running_claude_stack

QUESTION: list[Any] = [{"role": "system", "content": "You answer for the accounts team."},
                       {"role": "user", "content": "Summarise the payment terms."}]


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClaudeStack]:
    with running_claude_stack(tmp_path_factory.mktemp("chat-stream")) as running:
        yield running




def test_a_stream_says_what_the_whole_answer_says_with_usage_last_booked_exactly(claude: ClaudeStack) -> None:
    client = claude.openai_client()
    whole = client.chat.completions.create(model="claude-small", max_tokens=40, messages=QUESTION)
    task_id = claude.open_task()
    chunks = list(client.chat.completions.create(model="claude-small", max_tokens=40, messages=QUESTION, stream=True,
                                                 stream_options={"include_usage": True}, extra_headers={"x-task-id": task_id}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    *content, last = chunks
    assert last.choices == [] and last.usage is not None and all(c.usage is None for c in content)
    record = claude.sim.state.usage.records[-1]
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (record.uncached_input, record.output)
    assert last.usage == whole.usage
    [booked] = claude.task_events(task_id)
    assert booked["status"] == "ok" and booked["usage_confirmed"]
    assert (booked["prompt_tokens"], booked["completion_tokens"]) == (record.uncached_input, record.output)
    assert Decimal(booked["cost_usd"]) == formula(record)


def test_without_include_usage_no_usage_chunk_is_sent(claude: ClaudeStack) -> None:
    chunks = list(claude.openai_client().chat.completions.create(model="claude-small", max_tokens=8, messages=QUESTION,
                                                                 stream=True))
    assert chunks and all(c.usage is None and c.choices for c in chunks)


def test_a_length_stop_streams_as_length(claude: ClaudeStack) -> None:
    chunks = list(claude.openai_client().chat.completions.create(
        model="claude-small", max_tokens=3, stream=True, messages=[{"role": "user", "content": "Tell me a long story."}]))
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]


def test_a_streamed_tool_call_arrives_as_argument_deltas(claude: ClaudeStack) -> None:
    tools: list[Any] = [{"type": "function", "function": {
        "name": "invoice_total", "description": "The total of an invoice",
        "parameters": {"type": "object", "properties": {"invoice": {"type": "string"}}, "required": ["invoice"]}}}]
    chunks = list(claude.openai_client().chat.completions.create(
        model="claude-small", max_tokens=128, tools=tools, stream=True,
        messages=[{"role": "user", "content": "How much is invoice 42?"}]))
    calls = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].id and calls[0].function is not None and calls[0].function.name == "invoice_total"
    arguments = "".join(call.function.arguments or "" for call in calls if call.function is not None)
    assert len(calls) > 2 and set(httpx.Response(200, content=arguments).json()) == {"invoice"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]
    assert claude.sim.stats.last_body is not None and claude.sim.stats.last_body["stream"] is True


def test_an_upstream_error_before_the_stream_is_the_sdks_own_exception(claude: ClaudeStack) -> None:
    import openai
    claude.sim.config.spend_limited = True
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            claude.openai_client().chat.completions.create(model="claude-small", max_tokens=8, messages=QUESTION, stream=True)
    finally:
        claude.sim.config.spend_limited = False
    assert "credit balance" in caught.value.message
    assert caught.value.response.headers["x-should-retry"] == "false"
