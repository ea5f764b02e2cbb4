"""OpenAI-style rate limits: Go duration strings, token buckets, header values."""

from __future__ import annotations

import pytest

from gateway.sim.ratelimit import RateLimiter, format_go_duration, retry_after_headers


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0s"),
        (0.012, "12ms"),
        (0.0005, "500µs"),
        (1, "1s"),
        (1.5, "1.5s"),
        (20.4, "20.4s"),
        (360, "6m0s"),
        (61.25, "1m1.25s"),
        (3723.5, "1h2m3.5s"),
        (0.1234567, "123ms"),
    ],
)
def test_go_duration_format(seconds: float, expected: str) -> None:
    assert format_go_duration(seconds) == expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def headers(decision_headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in decision_headers}


def test_requests_limit_refills_over_the_minute() -> None:
    clock = FakeClock()
    limiter = RateLimiter(clock=clock)
    assert limiter.check("m", rpm=2, tpm=None, tokens=10).exceeded is None
    second = limiter.check("m", rpm=2, tpm=None, tokens=10)
    assert second.exceeded is None
    assert headers(second.headers) == {
        "x-ratelimit-limit-requests": "2",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1m0s",
    }
    third = limiter.check("m", rpm=2, tpm=None, tokens=10)
    assert third.exceeded == "requests"
    assert third.retry_after_s == pytest.approx(30.0)
    assert "Limit 2, Used 2, Requested 1" in third.message
    clock.now += 30
    assert limiter.check("m", rpm=2, tpm=None, tokens=10).exceeded is None


def test_tokens_limit_and_limits_are_per_model() -> None:
    clock = FakeClock()
    limiter = RateLimiter(clock=clock)
    assert limiter.check("a", rpm=None, tpm=1000, tokens=800).exceeded is None
    over = limiter.check("a", rpm=None, tpm=1000, tokens=300)
    assert over.exceeded == "tokens" and over.retry_after_s == pytest.approx(6.0)
    assert headers(over.headers)["x-ratelimit-remaining-tokens"] == "200"
    assert limiter.check("b", rpm=None, tpm=1000, tokens=300).exceeded is None


def test_refused_request_takes_nothing() -> None:
    limiter = RateLimiter(clock=FakeClock())
    limiter.check("m", rpm=10, tpm=100, tokens=90)
    assert limiter.check("m", rpm=10, tpm=100, tokens=50).exceeded == "tokens"
    assert headers(limiter.check("m", rpm=10, tpm=100, tokens=10).headers)["x-ratelimit-remaining-requests"] == "8"


def test_no_limits_no_headers() -> None:
    assert RateLimiter().check("m", None, None, 5).headers == []


def test_retry_after_rounds_up_and_keeps_ms() -> None:
    assert dict(retry_after_headers(1.2)) == {b"retry-after": b"2", b"retry-after-ms": b"1200"}
