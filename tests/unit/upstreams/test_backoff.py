"""Retry policy: which failures to retry, how long to wait, and how many retries to afford."""

from __future__ import annotations

import random

import pytest

from gateway.upstreams.backoff import (
    BUDGET,
    CONNECT,
    HTTP,
    QUOTA,
    TIMEOUT,
    RetryBudget,
    classify_http_error,
    is_retryable,
    retry_delay,
)
from gateway.upstreams.ratelimit_headers import ProviderLimits


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
def test_transient_statuses_are_retried(status: int) -> None:
    assert is_retryable(status, HTTP)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422, 200, 501])
def test_client_errors_are_not_retried(status: int) -> None:
    assert not is_retryable(status, HTTP)


def test_transport_failures_are_retried_and_refusals_are_not() -> None:
    assert is_retryable(None, CONNECT) and is_retryable(None, TIMEOUT)
    assert not is_retryable(429, BUDGET)
    assert not is_retryable(429, QUOTA)
    assert not is_retryable(None, HTTP)


def test_a_spend_limit_429_without_retry_after_is_not_retried() -> None:
    spend = "This request would exceed your account's monthly spend limit. Please try again later."
    assert classify_http_error(429, None, spend, ProviderLimits()) == QUOTA
    assert classify_http_error(429, "insufficient_quota", "You exceeded your current quota", None) == QUOTA
    # With a retry-after the provider promises recovery, so it is an ordinary 429.
    assert classify_http_error(429, None, spend, ProviderLimits(retry_after_s=30)) == HTTP
    assert classify_http_error(429, "rate_limit_exceeded", "Rate limit reached", None) == HTTP
    assert classify_http_error(500, None, "quota service down", None) == HTTP


def test_retry_after_is_honoured_exactly() -> None:
    rng = random.Random(1)
    assert retry_delay(0, ProviderLimits(retry_after_s=0.25), rng=rng) == 0.25
    # Longer than the backoff cap: the provider's word still wins.
    assert retry_delay(5, ProviderLimits(retry_after_s=30.0), rng=rng) == 30.0


def test_the_reset_of_an_exhausted_limit_is_honoured() -> None:
    provider = ProviderLimits(requests_remaining=10, requests_reset_s=50.0, tokens_remaining=0, tokens_reset_s=4.5)
    assert retry_delay(0, provider, rng=random.Random(1)) == 4.5
    both = ProviderLimits(requests_remaining=0, requests_reset_s=2.0, tokens_remaining=0, tokens_reset_s=4.5)
    assert retry_delay(0, both, rng=random.Random(1)) == 4.5


def test_resets_of_healthy_limits_are_ignored() -> None:
    healthy = ProviderLimits(requests_remaining=10, requests_reset_s=50.0, tokens_remaining=900, tokens_reset_s=60.0)
    assert retry_delay(0, healthy, base_s=0.5, rng=random.Random(1)) <= 0.5


@pytest.mark.parametrize("attempt", [0, 1, 2, 3, 4, 5, 10, 1000])
def test_full_jitter_stays_within_the_exponential_ceiling(attempt: int) -> None:
    rng = random.Random(attempt)
    ceiling = min(8.0, 0.5 * 2**attempt)
    delays = [retry_delay(attempt, None, base_s=0.5, cap_s=8.0, rng=rng) for _ in range(2000)]
    assert all(0.0 <= d <= ceiling for d in delays)
    # Full jitter: spread over the whole range, not clustered at the top.
    assert min(delays) < 0.05 * ceiling and max(delays) > 0.95 * ceiling


def test_retry_budget_caps_attempts_per_request() -> None:
    budget = RetryBudget(max_attempts=3)
    budget.record_attempt(is_retry=False)
    assert budget.allow()
    budget.record_attempt(is_retry=True)
    assert budget.allow()
    budget.record_attempt(is_retry=True)
    assert not budget.allow()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_retry_budget_keeps_retries_to_a_ratio_of_first_attempts() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_retries=0, window_s=10.0, clock=clock)
    for _ in range(50):
        budget.record_attempt(is_retry=False)
    retries = 0
    while budget.allow():
        budget.record_attempt(is_retry=True)
        retries += 1
    assert retries == 10  # 20% of 50


def test_retry_budget_has_slack_when_cold_and_forgets_old_attempts() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_retries=2, window_s=10.0, clock=clock)
    budget.record_attempt(is_retry=False)
    assert budget.allow()
    budget.record_attempt(is_retry=True)
    assert budget.allow()
    budget.record_attempt(is_retry=True)
    assert not budget.allow()  # 2 retries of slack + 0.2 x 1 first attempt
    clock.now += 25  # two windows later, none of that history counts
    assert budget.allow()


def test_retry_budget_slides_over_the_previous_window() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.5, min_retries=0, window_s=10.0, clock=clock)
    for _ in range(20):
        budget.record_attempt(is_retry=False)
    for _ in range(10):
        budget.record_attempt(is_retry=True)
    assert not budget.allow()
    clock.now += 15  # half of the previous window still counts: 10 firsts, 5 retries
    assert not budget.allow()
    budget.record_attempt(is_retry=False)
    budget.record_attempt(is_retry=False)
    assert budget.allow()  # 5 + 1 <= 0.5 x 12
