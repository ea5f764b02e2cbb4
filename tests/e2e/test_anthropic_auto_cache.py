"""Automatic cache breakpoints (`auto_cache_control: true` on a model): a tenant whose
client marks no `cache_control` still gets Anthropic's prompt cache on its stable
system prompt - the second call reads what the first wrote and is billed at the cached
rate, to the last digit - through the anthropic SDK and through the openai SDK; a
client's own breakpoints are left as they are."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from tests.support.claude import ClaudeStack, formula, running_claude_stack

AUTO = ("  claude-auto:\n    upstream: claude\n    upstream_model: claude-haiku-4-5\n"
        "    price: {input: 0.80, cached_input: 0.08, cache_write: 1.00, output: 4.00}\n    auto_cache_control: true\n")
POLICY = "Refunds are issued within fourteen days of a valid claim, to the original payment method. " * 100


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClaudeStack]:
    with running_claude_stack(tmp_path_factory.mktemp("auto-cache"), models=AUTO) as running:
        yield running


def test_a_messages_call_without_breakpoints_gets_one_and_the_second_call_reads_it(claude: ClaudeStack) -> None:
    client = claude.client()
    costs, records = [], []
    for question in ("Can I get a refund?", "How long does it take?"):
        raw = client.messages.with_raw_response.create(model="claude-auto", max_tokens=16, system="Support desk. " + POLICY,
                                                       messages=[{"role": "user", "content": question}])
        assert raw.parse().usage.cache_read_input_tokens == claude.sim.state.usage.records[-1].cache_read
        costs.append(Decimal(raw.headers["x-gateway-cost-usd"]))
        records.append(claude.sim.state.usage.records[-1])
    assert claude.sim.stats.last_body is not None
    assert claude.sim.stats.last_body["system"] == [{"type": "text", "text": "Support desk. " + POLICY,
                                                     "cache_control": {"type": "ephemeral"}}]
    written, read = records
    assert written.cache_write_5m > 1024 and read.cache_read == written.cache_write_5m
    assert costs == [formula(written), formula(read)] and costs[1] < costs[0]


def test_a_chat_call_gets_one_too_and_is_billed_with_cache_reads(claude: ClaudeStack) -> None:
    client = claude.openai_client()
    costs, usages = [], []
    for question in ("Can I get a refund?", "How long does it take?"):
        raw = client.chat.completions.with_raw_response.create(
            model="claude-auto", max_tokens=16,
            messages=[{"role": "system", "content": "Chat desk. " + POLICY}, {"role": "user", "content": question}])
        costs.append(Decimal(raw.headers["x-gateway-cost-usd"]))
        usages.append(raw.parse().usage)
    written, read = claude.sim.state.usage.records[-2:]
    assert read.cache_read == written.cache_write_5m > 1024
    assert usages[1] is not None and usages[1].prompt_tokens_details is not None
    assert usages[1].prompt_tokens_details.cached_tokens == read.cache_read
    assert costs == [formula(written), formula(read)]


def test_a_clients_own_breakpoint_is_left_alone(claude: ClaudeStack) -> None:
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]}]
    claude.client().messages.create(model="claude-auto", max_tokens=8, system="Support desk. " + POLICY, messages=messages)
    sent = claude.sim.stats.last_body
    assert sent is not None and sent["system"] == "Support desk. " + POLICY and sent["messages"] == messages


def test_a_model_without_the_option_gets_no_breakpoint(claude: ClaudeStack) -> None:
    claude.client().messages.create(model="claude-small", max_tokens=8, system="Support desk. " + POLICY,
                                    messages=[{"role": "user", "content": "Hi"}])
    sent = claude.sim.stats.last_body
    assert sent is not None and sent["system"] == "Support desk. " + POLICY
