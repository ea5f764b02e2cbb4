"""Limits become bucket specs; take results become OpenAI's rate-limit headers."""

from __future__ import annotations

import math

import pytest

from gateway.admission.buckets import TakeResult
from gateway.admission.limits import (
    model_specs,
    ratelimit_headers,
    request_takes,
    retry_after_header,
    tenant_specs,
    upstream_specs,
)


def test_specs_per_minute_limits() -> None:
    rpm, tpm = tenant_specs("acme", rpm=120, tpm=60_000)
    assert (rpm.key, rpm.scope, rpm.capacity, rpm.refill_per_s) == ("tenant:acme:rpm", "tenant:acme", 120, 2.0)
    assert (tpm.key, tpm.capacity, tpm.refill_per_s) == ("tenant:acme:tpm", 60_000, 1000.0)
    assert [s.key for s in model_specs("gpt-4o", rpm=None, tpm=10)] == ["model:gpt-4o:tpm"]
    assert [s.scope for s in upstream_specs("openai", rpm=5, tpm=None)] == ["upstream:openai"]
    assert tenant_specs("acme", None, None) == []
    with pytest.raises(ValueError):
        tenant_specs("acme", rpm=-1, tpm=None)


def test_a_request_takes_one_request_and_its_token_bound() -> None:
    rpm, tpm = tenant_specs("acme", rpm=10, tpm=1000)
    assert request_takes([rpm, tpm], tokens=350) == [(rpm, 1.0), (tpm, 350.0)]


def test_openai_ratelimit_headers() -> None:
    rpm, tpm = tenant_specs("acme", rpm=60, tpm=360_000)
    result = TakeResult(
        granted=True,
        wait_s=0.0,
        remaining={rpm.key: 59.0, tpm.key: 359_000.4},
        reset_s={rpm.key: 1.0, tpm.key: 0.012},
    )
    assert ratelimit_headers(result, rpm, tpm) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "360000",
        "x-ratelimit-remaining-tokens": "359000",
        "x-ratelimit-reset-tokens": "12ms",
    }


def test_debt_shows_zero_remaining_and_minutes_format_like_go() -> None:
    (tpm,) = tenant_specs("acme", rpm=None, tpm=100)
    result = TakeResult(granted=False, wait_s=5.0, remaining={tpm.key: -500.0}, reset_s={tpm.key: 360.0})
    headers = ratelimit_headers(result, None, tpm)
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["x-ratelimit-reset-tokens"] == "6m0s"
    assert "x-ratelimit-limit-requests" not in headers


def test_buckets_missing_from_the_result_get_no_headers() -> None:
    rpm, _ = tenant_specs("acme", rpm=60, tpm=100)
    assert ratelimit_headers(TakeResult(True, 0.0, {}, {}), rpm, None) == {}


@pytest.mark.parametrize(
    ("wait_s", "seconds", "ms"),
    [(0.0, "1", "1"), (0.2, "1", "200"), (1.0, "1", "1000"), (1.0001, "2", "1001"), (2.0000000001, "2", "2000"), (59.5, "60", "59500")],
)
def test_retry_after_rounds_up_to_whole_seconds(wait_s: float, seconds: str, ms: str) -> None:
    assert retry_after_header(wait_s) == {"retry-after": seconds, "retry-after-ms": ms}


def test_no_retry_after_for_a_request_that_can_never_fit() -> None:
    assert retry_after_header(math.inf) == {}
