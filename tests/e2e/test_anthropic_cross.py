"""The Messages API in front of models whose upstream speaks OpenAI's chat dialect (the
hosted simulator, a vLLM pool), reached with the real anthropic SDK: the request is
translated to chat (system, tools and their results, images, stop sequences, metadata,
bounds), the answer comes back as a Messages answer - whole, or as Anthropic's exact
event sequence - and the books hold the upstream's usage at the model's prices to the
last digit. A model's fallbacks may be of either dialect, both ways round."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from gateway.sim.anthropic import AnthropicSimConfig
from tests.support.claude import UPSTREAM_KEY, ClaudeStack, formula, gpt_formula, running_claude_stack

# Two models whose first choice fails over to the other dialect.
FALLBACKS = ("  claude-then-gpt:\n    upstream: claude\n    upstream_model: claude-haiku-4-5\n"
             "    price: {input: 0.80, cached_input: 0.08, cache_write: 1.00, output: 4.00}\n    fallbacks: [gpt-4o-mini]\n"
             "  gpt-then-claude:\n    upstream: hosted\n    upstream_model: sim-large\n"
             "    price: {input: 2.50, cached_input: 1.25, output: 10.00}\n    fallbacks: [claude-small]\n")
TOOLS: list[Any] = [{"name": "invoice_total", "description": "The total of an invoice",
                     "input_schema": {"type": "object", "properties": {"invoice": {"type": "string"}}, "required": ["invoice"]}}]
PIXEL = base64.b64encode(bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                                       "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082")).decode()


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClaudeStack]:
    config = AnthropicSimConfig(api_keys=[UPSTREAM_KEY])
    with running_claude_stack(tmp_path_factory.mktemp("cross"), config, models=FALLBACKS) as running:
        yield running


def hosted_config(claude: ClaudeStack, **patch: object) -> None:
    httpx.post(f"{claude.stack.hosted}/sim/config", json=patch, timeout=5).raise_for_status()




def test_a_messages_call_is_sent_as_chat_and_answered_as_a_message_at_the_formula(claude: ClaudeStack) -> None:
    system: Any = [{"type": "text", "text": "You answer for the accounts team."},
                   {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    raw = claude.client().messages.with_raw_response.create(
        model="gpt-4o-mini", max_tokens=40, system=system, extra_body={"temperature": 0.2, "top_p": 0.9}, stop_sequences=["\n\nHuman:"],
        metadata={"user_id": "clerk-17"}, messages=[{"role": "user", "content": "What is due this week?"}])
    message = raw.parse()
    sent = claude.hosted_stats()["last_body"]
    assert sent["messages"] == [{"role": "system", "content": "You answer for the accounts team.\n\nBe brief."},
                                {"role": "user", "content": "What is due this week?"}]
    assert (sent["max_completion_tokens"], sent["temperature"], sent["top_p"], sent["stop"], sent["user"]) == (
        40, 0.2, 0.9, ["\n\nHuman:"], "clerk-17")
    assert "system" not in sent and "metadata" not in sent and "stop_sequences" not in sent
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason == "end_turn"
    record = claude.hosted_usage()[-1]
    assert (message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0), message.usage.output_tokens) == (
        record["input_tokens"], record["output_tokens"])
    assert Decimal(raw.headers["x-gateway-cost-usd"]) == gpt_formula(record)
    assert raw.headers["x-gateway-model"] == "gpt-4o-mini"


def test_a_length_stop_is_max_tokens(claude: ClaudeStack) -> None:
    message = claude.client().messages.create(model="gpt-4o-mini", max_tokens=3,
                                              messages=[{"role": "user", "content": "Tell me a long story."}])
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3


def test_a_tool_call_round_trip_through_chat(claude: ClaudeStack) -> None:
    client = claude.client()
    question: Any = {"role": "user", "content": "How much is invoice 42?"}
    first = client.messages.create(model="gpt-4o-mini", max_tokens=128, tools=TOOLS, messages=[question],
                                   tool_choice={"type": "any"})
    sent = claude.hosted_stats()["last_body"]
    assert sent["tools"] == [{"type": "function", "function": {"name": "invoice_total", "description": "The total of an invoice",
                                                               "parameters": TOOLS[0]["input_schema"]}}]
    assert sent["tool_choice"] == "required"
    assert first.stop_reason == "tool_use"
    call = next(block for block in first.content if block.type == "tool_use")
    assert call.name == "invoice_total" and isinstance(call.input, dict) and "invoice" in call.input
    result: Any = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "1,250.00 EUR"},
                                              {"type": "text", "text": "In euros, please."}]}
    second = client.messages.create(model="gpt-4o-mini", max_tokens=64, tools=TOOLS, tool_choice={"type": "none"},
                                    messages=[question, {"role": "assistant", "content": first.content}, result])
    assert claude.hosted_stats()["last_body"]["tool_choice"] == "none"
    sent = claude.hosted_stats()["last_body"]["messages"]
    assert sent[1]["role"] == "assistant" and sent[1]["tool_calls"][0]["id"] == call.id
    assert sent[1]["tool_calls"][0]["function"]["name"] == "invoice_total"
    assert sent[2] == {"role": "tool", "tool_call_id": call.id, "content": "1,250.00 EUR"}
    assert sent[3] == {"role": "user", "content": "In euros, please."}
    assert second.content[0].type == "text" and second.stop_reason == "end_turn"


def test_an_image_goes_as_an_image_url(claude: ClaudeStack) -> None:
    claude.client().messages.create(model="gpt-4o-mini", max_tokens=16, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}},
        {"type": "text", "text": "What is in this picture?"}]}])
    [user] = claude.hosted_stats()["last_body"]["messages"]
    assert user["content"] == [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
                               {"type": "text", "text": "What is in this picture?"}]


def test_a_stream_is_anthropics_exact_event_sequence_and_booked_at_its_usage(claude: ClaudeStack) -> None:
    client = claude.client()
    ask: dict[str, Any] = {"model": "gpt-4o-mini", "max_tokens": 48, "system": "You answer for the accounts team.",
                           "messages": [{"role": "user", "content": "Summarise the payment terms."}]}
    whole = client.messages.create(**ask)
    task_id = claude.open_task()
    kinds: list[str] = []
    with client.messages.stream(**ask, extra_headers={"x-task-id": task_id}) as stream:
        for event in stream:
            kinds.append(event.type if event.type != "content_block_delta" else f"delta:{event.delta.type}")
        final = stream.get_final_message()
    assert kinds[:3] == ["message_start", "content_block_start", "delta:text_delta"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) <= {"delta:text_delta", "text"}
    assert final.content[0].type == whole.content[0].type == "text"
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == "end_turn"
    record = claude.hosted_usage()[-1]
    assert (final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0), final.usage.output_tokens) == (
        record["input_tokens"], record["output_tokens"])
    [booked] = claude.task_events(task_id)
    assert booked["status"] == "ok" and booked["usage_confirmed"]
    assert (booked["prompt_tokens"], booked["cached_tokens"], booked["completion_tokens"]) == (
        record["input_tokens"], record["cached_tokens"], record["output_tokens"])
    assert Decimal(booked["cost_usd"]) == gpt_formula(record)


def test_the_raw_stream_has_the_ping_and_every_event_in_order(claude: ClaudeStack) -> None:
    body = {"model": "gpt-4o-mini", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    with httpx.stream("POST", f"{claude.stack.root}/v1/messages", json=body, timeout=10,
                      headers={"x-api-key": claude.stack.key, "anthropic-version": "2023-06-01"}) as response:
        text = response.read().decode()
    names = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert names[:4] == ["message_start", "content_block_start", "ping", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[4:-3]) == {"content_block_delta"}


def test_a_streamed_tool_call_arrives_as_input_json_deltas(claude: ClaudeStack) -> None:
    with claude.client().messages.stream(model="gpt-4o-mini", max_tokens=128, tools=TOOLS, tool_choice={"type": "any"},
                                         messages=[{"role": "user", "content": "How much is invoice 42?"}]) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert deltas and set(deltas) == {"input_json_delta"}
    assert final.stop_reason == "tool_use"
    [call] = [block for block in final.content if block.type == "tool_use"]
    assert call.name == "invoice_total" and "invoice" in call.input


def test_a_model_on_a_vllm_pool_answers_the_messages_api(claude: ClaudeStack) -> None:
    raw = claude.client().messages.with_raw_response.create(model="pool-model", max_tokens=16,
                                                            messages=[{"role": "user", "content": "Hi"}])
    message = raw.parse()
    assert message.content[0].type == "text" and message.content[0].text
    assert message.usage.output_tokens > 0 and Decimal(raw.headers["x-gateway-cost-usd"]) > 0
    assert raw.headers["x-gateway-upstream"] == "pool"


def test_count_tokens_for_a_chat_model_is_the_gateways_own_count(claude: ClaudeStack) -> None:
    requests = claude.hosted_stats()["requests"]
    counted = claude.client().messages.count_tokens(model="gpt-4o-mini", system="You answer for the accounts team.",
                                                    messages=[{"role": "user", "content": "What is due this week?"}])
    assert 10 < counted.input_tokens < 40
    assert claude.hosted_stats()["requests"] == requests  # nothing asked of, or billed by, the upstream


def test_an_overloaded_claude_fails_over_to_the_chat_model(claude: ClaudeStack) -> None:
    claude.sim.config.fail_529_rate = 1.0
    try:
        raw = claude.client().messages.with_raw_response.create(
            model="claude-then-gpt", max_tokens=24, messages=[{"role": "user", "content": "Is invoice 7 overdue?"}])
    finally:
        claude.sim.config.fail_529_rate = 0.0
    message = raw.parse()
    assert raw.headers["x-gateway-model"] == "gpt-4o-mini" and message.content[0].type == "text"
    assert Decimal(raw.headers["x-gateway-cost-usd"]) == gpt_formula(claude.hosted_usage()[-1])


def test_a_failing_chat_model_fails_over_to_claude_natively(claude: ClaudeStack) -> None:
    hosted_config(claude, fail_5xx_rate=1.0)
    system: Any = [{"type": "text", "text": "Invoices are due in thirty days. " * 200, "cache_control": {"type": "ephemeral"}}]
    try:
        raw = claude.client().messages.with_raw_response.create(
            model="gpt-then-claude", max_tokens=24, system=system, messages=[{"role": "user", "content": "Is invoice 7 overdue?"}])
    finally:
        hosted_config(claude, fail_5xx_rate=0.0)
    message = raw.parse()
    assert raw.headers["x-gateway-model"] == "claude-small"
    assert claude.sim.stats.last_body is not None and claude.sim.stats.last_body["system"] == system  # untranslated
    record = claude.sim.state.usage.records[-1]
    assert message.usage.cache_creation_input_tokens == record.cache_write_5m > 0
    assert Decimal(raw.headers["x-gateway-cost-usd"]) == formula(record)  # the failed attempts cost nothing
