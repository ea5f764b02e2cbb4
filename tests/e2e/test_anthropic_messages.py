"""`POST /v1/messages` through the gateway, reached with the real anthropic SDK, in front
of the Anthropic simulator over real sockets: the body goes upstream as the client sent
it (only the model renamed), the answer comes back as the upstream sent it, the books
hold the provider's usage at the model's prices to the last digit, errors arrive as the
SDK's own exception classes, and nothing of the provider's (key, address, rate-limit
headers) reaches the client."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.claude import PRICE, UPSTREAM_KEY, ClaudeStack, formula, litellm_one_hour_rate, running_claude_stack

LONG_POLICY = "Invoices are due thirty days after issue; overdue ones accrue interest monthly. " * 120


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClaudeStack]:
    with running_claude_stack(tmp_path_factory.mktemp("claude")) as running:
        yield running


def assert_nothing_of_the_provider(claude: ClaudeStack, headers: httpx.Headers, body: str) -> None:
    assert not [name for name in headers if name.lower().startswith("anthropic-ratelimit")]
    for secret in (UPSTREAM_KEY, claude.sim_url, claude.sim_url.removeprefix("http://")):
        assert secret not in body and secret not in str(headers)


def test_text_goes_through_untouched_but_for_the_model_and_costs_the_formula(claude: ClaudeStack) -> None:
    client = claude.client(default_headers={"anthropic-beta": "token-efficient-tools-2025-02-19"})
    system = [{"type": "text", "text": "You answer for the accounts team."}]
    raw = client.messages.with_raw_response.create(
        model="claude-small", max_tokens=64, system=system, extra_body={"temperature": 0.2}, stop_sequences=["\n\nHuman:"],
        metadata={"user_id": "clerk-17"}, messages=[{"role": "user", "content": "What is due this week?"}])
    message = raw.parse()
    sent = claude.sim.stats.last_body
    assert sent is not None
    assert sent["model"] == "claude-haiku-4-5"
    assert (sent["system"], sent["metadata"], sent["stop_sequences"], sent["temperature"], sent["max_tokens"]) == (
        system, {"user_id": "clerk-17"}, ["\n\nHuman:"], 0.2, 64)
    assert claude.sim.stats.last_authorization == UPSTREAM_KEY  # the provider's key, never the tenant's
    assert claude.sim.stats.last_version == raw.http_response.request.headers["anthropic-version"]  # the client's
    assert claude.sim.stats.last_beta == "token-efficient-tools-2025-02-19"
    assert message.type == "message" and message.stop_reason == "end_turn"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.model == "claude-haiku-4-5"  # the answer as the upstream sent it
    record = claude.sim.state.usage.records[-1]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (record.uncached_input, record.output)
    assert Decimal(raw.headers["x-gateway-cost-usd"]) == formula(record)
    assert raw.headers["x-gateway-model"] == "claude-small"
    assert_nothing_of_the_provider(claude, raw.headers, raw.http_response.text)


def test_a_gateway_key_in_x_api_key_is_accepted(claude: ClaudeStack) -> None:
    response = httpx.post(f"{claude.stack.root}/v1/messages", timeout=10,
                          headers={"x-api-key": claude.stack.key, "anthropic-version": "2023-06-01"},
                          json={"model": "claude-small", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]})
    assert response.status_code == 200, response.text
    assert response.json()["type"] == "message"
    assert_nothing_of_the_provider(claude, response.headers, response.text)


def test_a_tool_call_round_trip(claude: ClaudeStack) -> None:
    client = claude.client()
    tools: list[Any] = [{"name": "invoice_total", "description": "The total of an invoice",
                         "input_schema": {"type": "object", "properties": {"invoice": {"type": "string"}},
                                          "required": ["invoice"]}}]
    question: Any = {"role": "user", "content": "How much is invoice 42?"}
    first = client.messages.create(model="claude-small", max_tokens=128, tools=tools, messages=[question])
    assert first.stop_reason == "tool_use"
    call = next(block for block in first.content if block.type == "tool_use")
    assert call.name == "invoice_total" and isinstance(call.input, dict)
    assert claude.sim.stats.last_body is not None and claude.sim.stats.last_body["tools"] == tools
    result: Any = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "1,250.00 EUR"}]}
    second = client.messages.create(model="claude-small", max_tokens=128, tools=tools,
                                    messages=[question, {"role": "assistant", "content": first.content}, result])
    assert second.stop_reason == "end_turn" and second.content[0].type == "text"
    assert claude.sim.stats.last_body["messages"][2] == result


def test_cache_writes_and_reads_are_billed_at_their_own_prices(claude: ClaudeStack) -> None:
    client = claude.client()
    system: Any = [{"type": "text", "text": LONG_POLICY, "cache_control": {"type": "ephemeral"}}]
    costs, records = [], []
    for question in ("Is invoice 7 overdue?", "And invoice 9?"):
        raw = client.messages.with_raw_response.create(model="claude-small", max_tokens=32, system=system,
                                                       messages=[{"role": "user", "content": question}])
        message = raw.parse()
        costs.append(Decimal(raw.headers["x-gateway-cost-usd"]))
        records.append(claude.sim.state.usage.records[-1])
        assert message.usage.cache_read_input_tokens == records[-1].cache_read
    written, read = records
    assert written.cache_write_5m > 1024 and written.cache_read == 0
    assert read.cache_read == written.cache_write_5m and read.cache_write_5m == 0
    assert costs == [formula(written), formula(read)]
    assert costs[1] < costs[0]


def test_one_hour_cache_writes_are_billed_at_their_own_rate(claude: ClaudeStack) -> None:
    client = claude.client()
    system: Any = [{"type": "text", "text": "An hour-long policy. " + LONG_POLICY, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    ask: dict[str, Any] = {"model": "claude-small", "max_tokens": 16, "system": system,
                           "messages": [{"role": "user", "content": "Is invoice 3 overdue?"}]}
    # In a task, so that its books are committed before it is answered (read below).
    raw = client.messages.with_raw_response.create(**ask, extra_headers={"x-task-id": claude.open_task()})
    written = claude.sim.state.usage.records[-1]
    assert raw.parse().usage.cache_creation is not None
    assert raw.parse().usage.cache_creation.ephemeral_1h_input_tokens == written.cache_write_1h > 1024
    assert written.cache_write_5m == 0
    hour_rate = litellm_one_hour_rate()
    assert hour_rate > PRICE["cache_write"]  # the policy names no 1-hour rate: litellm's applies
    expected = (written.uncached_input * PRICE["input"] + written.cache_write_1h * hour_rate
                + written.output * PRICE["output"]) / 1_000_000
    assert Decimal(raw.headers["x-gateway-cost-usd"]) == expected == formula(written)
    with sqlite3.connect(claude.stack.var_dir / "ledger.db") as ledger:  # the ledger keeps the 1-hour share apart
        row = ledger.execute("SELECT cache_write_tokens, cache_write_1h_tokens FROM usage_events WHERE request_id = ?",
                             (raw.headers["x-request-id"],)).fetchone()
    assert row == (written.cache_write_1h, written.cache_write_1h)
    task_id = claude.open_task()  # streamed, a read of what the first call wrote
    with client.messages.stream(**ask, extra_headers={"x-task-id": task_id}) as stream:
        stream.until_done()
    read = claude.sim.state.usage.records[-1]
    assert read.cache_read == written.cache_write_1h and read.cache_write_1h == 0
    [booked] = claude.task_events(task_id)
    assert Decimal(booked["cost_usd"]) == formula(read)


def test_a_bad_key_is_an_authentication_error(claude: ClaudeStack) -> None:
    with pytest.raises(anthropic.AuthenticationError) as caught:
        claude.client(key="sk-gw-not-a-key").messages.create(
            model="claude-small", max_tokens=16, messages=[{"role": "user", "content": "Hi"}])
    assert caught.value.status_code == 401
    assert caught.value.body == {"type": "error", "error": {"type": "authentication_error", "message": "Incorrect API key provided"},
                                 "request_id": caught.value.response.headers["x-request-id"]}


def test_an_unknown_model_is_not_found(claude: ClaudeStack) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.client().messages.create(model="claude-nonesuch", max_tokens=16, messages=[{"role": "user", "content": "Hi"}])
    assert isinstance(caught.value.body, dict) and caught.value.body["error"]["type"] == "not_found_error"
    assert "claude-nonesuch" in caught.value.message


def test_a_model_whose_upstream_speaks_openai_answers_in_the_messages_shape(claude: ClaudeStack) -> None:
    # Once a 400 ("not kind: anthropic"); now translated both ways (tests/e2e/test_anthropic_cross.py).
    message = claude.client().messages.create(model="gpt-4o-mini", max_tokens=16, messages=[{"role": "user", "content": "Hi"}])
    assert message.type == "message" and message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")


def test_a_missing_max_tokens_is_a_bad_request_in_anthropic_shape(claude: ClaudeStack) -> None:
    response = httpx.post(f"{claude.stack.root}/v1/messages", timeout=10, headers={"x-api-key": claude.stack.key},
                          json={"model": "claude-small", "messages": [{"role": "user", "content": "Hi"}]})
    assert response.status_code == 400
    assert response.json()["error"] == {"type": "invalid_request_error", "message": "max_tokens: Field required (an integer)"}
    assert response.headers["x-should-retry"] == "false"


def test_an_exhausted_budget_is_a_rate_limit_error_not_worth_retrying(claude: ClaudeStack) -> None:
    billed = len(claude.sim.state.usage.records)
    with pytest.raises(anthropic.RateLimitError) as caught:
        claude.client(key=claude.stack.other_key).messages.create(
            model="claude-small", max_tokens=16, messages=[{"role": "user", "content": "Hi"}])
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert isinstance(caught.value.body, dict) and caught.value.body["error"]["type"] == "rate_limit_error"
    assert len(claude.sim.state.usage.records) == billed  # never sent upstream


def wait_until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within the deadline")
        time.sleep(0.02)




def test_a_stream_says_what_the_whole_answer_says_and_is_booked_at_its_usage(claude: ClaudeStack) -> None:
    client = claude.client()
    system: Any = [{"type": "text", "text": LONG_POLICY, "cache_control": {"type": "ephemeral"}}]
    ask: dict[str, Any] = {"model": "claude-small", "max_tokens": 48, "system": system,
                           "messages": [{"role": "user", "content": "Summarise the payment terms."}]}
    whole = client.messages.create(**ask)
    task_id = claude.open_task()
    kinds: list[str] = []
    with client.messages.stream(**ask, extra_headers={"x-task-id": task_id}) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
        headers = stream.response.headers
    assert final.content[0].type == whole.content[0].type == "text"
    assert final.content[0].text == whole.content[0].text
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert not [name for name in headers if name.lower().startswith("anthropic-ratelimit")]
    record = claude.sim.state.usage.records[-1]
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens, final.usage.output_tokens) == (
        record.uncached_input, record.cache_read, record.output)
    [booked] = claude.task_events(task_id)
    assert booked["status"] == "ok" and booked["usage_confirmed"]
    assert (booked["prompt_tokens"], booked["cached_tokens"], booked["completion_tokens"]) == (
        record.uncached_input + record.cache_read + record.cache_write_5m + record.cache_write_1h, record.cache_read, record.output)
    assert Decimal(booked["cost_usd"]) == formula(record)


def test_a_client_that_hangs_up_mid_stream_cancels_the_upstream_call(claude: ClaudeStack) -> None:
    claude.sim.config.token_delay_s = 0.05  # 20 tokens: a second of stream, of which the client reads one delta
    try:
        aborted = claude.sim.stats.aborted
        task_id = claude.open_task()
        with claude.client().messages.stream(model="claude-small", max_tokens=64, extra_headers={"x-task-id": task_id},
                                             messages=[{"role": "user", "content": "Tell me a long story."}]) as stream:
            for event in stream:
                if event.type == "content_block_delta":
                    break
        wait_until(lambda: claude.sim.stats.aborted == aborted + 1)
        wait_until(lambda: len(claude.task_events(task_id)) == 1)
        [booked] = claude.task_events(task_id)
        assert booked["status"] == "cancelled" and not booked["usage_confirmed"]
        assert booked["completion_tokens"] >= 1 and Decimal(booked["cost_usd"]) > 0  # an estimate, never $0
    finally:
        claude.sim.config.token_delay_s = 0.0


def test_count_tokens_is_passed_to_the_upstream_and_not_billed(claude: ClaudeStack) -> None:
    client = claude.client()
    billed = len(claude.sim.state.usage.records)
    counted = client.messages.count_tokens(model="claude-small", system="You answer for the accounts team.",
                                           messages=[{"role": "user", "content": "What is due this week?"}])
    assert counted.input_tokens > 0
    assert claude.sim.stats.last_body is not None and claude.sim.stats.last_body["model"] == "claude-haiku-4-5"
    assert len(claude.sim.state.usage.records) == billed
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-nonesuch", messages=[{"role": "user", "content": "Hi"}])
