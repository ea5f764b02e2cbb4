"""Providers' rate-limit headers read into ProviderLimits; garbage is ignored, never raised."""

from __future__ import annotations

import pytest

from gateway.upstreams.ratelimit_headers import (
    ProviderLimits,
    format_go_duration,
    may_be_exhausted,
    parse_go_duration,
    parse_provider_limits,
)

NOW = 1_717_243_200.0  # 2024-06-01T12:00:00Z


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("12ms", 0.012),
        ("1h30m0.5s", 5400.5),
        ("20.4s", 20.4),
        ("500µs", 0.0005),
        ("500us", 0.0005),
        ("7ns", 7e-9),
        ("0", 0.0),
        (".5s", 0.5),
        ("2h", 7200.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "1", "1x", "-1s", "1s garbage", "1.2.3s", "ms", "1e3s", "inf"])
def test_not_go_durations(text: str) -> None:
    assert parse_go_duration(text) is None


@pytest.mark.parametrize("seconds", [0, 0.012, 0.0005, 1, 1.5, 59.999, 60, 61.25, 360, 3723.5, 86400])
def test_formatted_durations_parse_back(seconds: float) -> None:
    assert parse_go_duration(format_go_duration(seconds)) == pytest.approx(seconds, abs=1e-9)


def test_go_formatting_matches_openai_headers() -> None:
    assert [format_go_duration(s) for s in (0, 0.012, 1, 360, 61.25, 3723.5)] == ["0s", "12ms", "1s", "6m0s", "1m1.25s", "1h2m3.5s"]


def test_openai_headers() -> None:
    limits = parse_provider_limits(
        {
            "X-RateLimit-Limit-Requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "29000",
            "x-ratelimit-reset-tokens": "2s",
        },
        now=NOW,
    )
    assert limits == ProviderLimits(499, 500, pytest.approx(0.12), 29000, 30000, pytest.approx(2.0), None)


def test_anthropic_headers_with_rfc3339_resets() -> None:
    limits = parse_provider_limits(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2024-06-01T12:00:30Z",
            "anthropic-ratelimit-tokens-limit": "80000",
            "anthropic-ratelimit-tokens-remaining": "1200",
            "anthropic-ratelimit-tokens-reset": "2024-06-01T12:00:05.250+00:00",
            "anthropic-ratelimit-input-tokens-remaining": "0",
        },
        now=NOW,
    )
    assert (limits.requests_limit, limits.requests_remaining, limits.requests_reset_s) == (50, 0, pytest.approx(30.0))
    # The combined tokens limit wins over the input/output split when sent.
    assert (limits.tokens_limit, limits.tokens_remaining, limits.tokens_reset_s) == (80000, 1200, pytest.approx(5.25))


def test_anthropic_split_token_limits_use_the_scarcer() -> None:
    limits = parse_provider_limits(
        {
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "39000",
            "anthropic-ratelimit-input-tokens-reset": "2024-06-01T12:00:01Z",
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "10",
            "anthropic-ratelimit-output-tokens-reset": "2024-06-01T12:00:45Z",
        },
        now=NOW,
    )
    assert (limits.tokens_limit, limits.tokens_remaining, limits.tokens_reset_s) == (8000, 10, pytest.approx(45.0))


def test_a_reset_in_the_past_means_now() -> None:
    limits = parse_provider_limits({"anthropic-ratelimit-requests-reset": "2024-06-01T11:00:00Z"}, now=NOW)
    assert limits.requests_reset_s == 0.0


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"Retry-After": "1.5"}, 1.5),
        ({"retry-after": "Sat, 01 Jun 2024 12:00:20 GMT"}, 20.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after": "20", "retry-after-ms": "19500"}, 19.5),  # the precise one wins
        ({"retry-after": "3", "retry-after-ms": "soon"}, 3.0),
    ],
)
def test_retry_after(headers: dict[str, str], seconds: float) -> None:
    assert parse_provider_limits(headers, now=NOW).retry_after_s == pytest.approx(seconds)


def test_garbage_is_ignored() -> None:
    garbage = {
        "x-ratelimit-limit-requests": "lots",
        "x-ratelimit-remaining-requests": "-3",
        "x-ratelimit-reset-requests": "whenever",
        "x-ratelimit-remaining-tokens": "nan",
        "x-ratelimit-limit-tokens": "1e999",
        "x-ratelimit-reset-tokens": "-2s",
        "anthropic-ratelimit-requests-reset": "2024-13-45T99:00:00Z",
        "anthropic-ratelimit-tokens-reset": "",
        "retry-after": "Someday, 99 Foo 20xx",
        "retry-after-ms": "inf",
    }
    assert parse_provider_limits(garbage, now=NOW) == ProviderLimits()


def test_garbage_falls_back_to_the_other_providers_header() -> None:
    limits = parse_provider_limits(
        {"x-ratelimit-remaining-requests": "??", "anthropic-ratelimit-requests-remaining": "4"}, now=NOW
    )
    assert limits.requests_remaining == 4


def test_no_headers_no_limits() -> None:
    assert parse_provider_limits({}) == ProviderLimits()


def test_epoch_seconds_in_a_reset_header_are_a_time_not_a_delay() -> None:
    assert parse_provider_limits({"x-ratelimit-reset-tokens": str(NOW + 42)}, now=NOW).tokens_reset_s == pytest.approx(42.0)


@pytest.mark.parametrize(("headers", "exhausted"), [
    ({"x-ratelimit-remaining-requests": "9999", "x-ratelimit-remaining-tokens": "1998000"}, False),
    ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-remaining-tokens": "1998000"}, True),
    ({"anthropic-ratelimit-output-tokens-remaining": "0"}, True),
    ({"X-RateLimit-Remaining-Tokens": "-1"}, True),
    ({"x-ratelimit-remaining-tokens": "soon"}, True),  # unreadable: the full parse decides
    ({"retry-after": "2"}, False),  # no count at all: nothing to learn on a success
])
def test_only_a_count_without_room_asks_for_the_full_parse(headers: dict[str, str], exhausted: bool) -> None:
    assert may_be_exhausted(headers) is exhausted
