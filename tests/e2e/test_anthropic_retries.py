"""Rate limits and retries on the Messages API, against the Anthropic simulator's
injected trouble, reached with the real anthropic SDK: a 429 with `retry-after` is
waited out and retried, a 529 (overloaded) is backed off and retried, and when the
retries are spent the client gets the SDK's own exception - RateLimitError, or
OverloadedError with `overloaded_error`; a spend-limit 429 without `retry-after` is
not retried at all (nor worth the client's retry). Nothing of the provider's - its
key, its address, its `anthropic-ratelimit-*` headers - reaches the client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.claude import UPSTREAM_KEY, ClaudeStack, running_claude_stack

ASK: dict[str, Any] = {"model": "claude-small", "max_tokens": 8, "messages": [{"role": "user", "content": "Is invoice 7 overdue?"}]}


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClaudeStack]:
    with running_claude_stack(tmp_path_factory.mktemp("retries")) as running:
        yield running


@pytest.fixture(autouse=True)
def healthy_after(claude: ClaudeStack) -> Iterator[None]:
    yield
    config = claude.sim.config
    config.fail_429_rate = config.fail_529_rate = 0.0
    config.spend_limited = False


def assert_nothing_of_the_provider(claude: ClaudeStack, response: httpx.Response) -> None:
    assert not [name for name in response.headers if name.lower().startswith("anthropic-ratelimit")]
    for secret in (UPSTREAM_KEY, claude.sim_url, claude.sim_url.removeprefix("http://")):
        assert secret not in response.text and secret not in str(response.headers)


def test_a_429_with_retry_after_is_waited_out_and_retried_before_it_reaches_the_client(claude: ClaudeStack) -> None:
    claude.sim.config.fail_429_rate, claude.sim.config.retry_after_s = 1.0, 1.0
    sent = claude.sim.stats.requests
    started = time.monotonic()
    with pytest.raises(anthropic.RateLimitError) as caught:
        claude.client().messages.create(**ASK)
    elapsed = time.monotonic() - started
    assert claude.sim.stats.requests - sent == 3  # the policy's max_attempts
    assert elapsed >= 2.0  # the provider's retry-after (1 s), before each of the two retries
    assert isinstance(caught.value.body, dict) and caught.value.body["error"]["type"] == "rate_limit_error"
    assert_nothing_of_the_provider(claude, caught.value.response)


def test_the_next_call_succeeds_once_the_upstream_recovers(claude: ClaudeStack) -> None:
    raw = claude.client().messages.with_raw_response.create(**ASK)
    assert raw.parse().type == "message"
    assert_nothing_of_the_provider(claude, raw.http_response)


def test_an_overloaded_upstream_is_retried_then_reported_as_overloaded(claude: ClaudeStack) -> None:
    claude.sim.config.fail_529_rate = 1.0
    sent = claude.sim.stats.requests
    with pytest.raises(anthropic.OverloadedError) as caught:
        claude.client().messages.create(**ASK)
    # Retried - as often as the upstream's retry budget still allows (the 429s above drew on it).
    assert 2 <= claude.sim.stats.requests - sent <= 3
    assert caught.value.status_code == 529
    assert isinstance(caught.value.body, dict) and caught.value.body["error"]["type"] == "overloaded_error"
    assert_nothing_of_the_provider(claude, caught.value.response)


def test_a_spend_limit_429_without_retry_after_is_not_retried(claude: ClaudeStack) -> None:
    claude.sim.config.spend_limited = True
    sent = claude.sim.stats.requests
    with pytest.raises(anthropic.RateLimitError) as caught:
        claude.client().messages.create(**ASK)
    assert claude.sim.stats.requests - sent == 1
    assert caught.value.response.headers["x-should-retry"] == "false"  # the SDK's own retries would not help either
    assert "credit balance" in caught.value.message
    assert_nothing_of_the_provider(claude, caught.value.response)


def test_a_stream_that_meets_an_overloaded_upstream_raises_the_sdks_error(claude: ClaudeStack) -> None:
    claude.sim.config.fail_529_rate = 1.0
    with pytest.raises(anthropic.OverloadedError), claude.client().messages.stream(**ASK) as stream:
        stream.until_done()
