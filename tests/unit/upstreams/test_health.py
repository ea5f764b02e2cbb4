"""Limits learned from a provider's headers slow the gateway down just enough."""

from __future__ import annotations

from gateway.upstreams.health import UpstreamHealth
from gateway.upstreams.ratelimit_headers import parse_provider_limits


def test_empty_request_limit_pauses_until_one_request_fits_not_a_full_reset() -> None:
    health = UpstreamHealth()
    health.learn("hosted", parse_provider_limits({
        "x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "60s"}))
    assert 5.0 < health.pause_left("hosted") <= 6.0  # 60 s / 10 requests


def test_remaining_capacity_does_not_pause() -> None:
    health = UpstreamHealth()
    health.learn("hosted", parse_provider_limits({
        "x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "20s"}))
    assert health.pause_left("hosted") == 0.0


def test_a_success_learns_an_exhausted_limit_from_its_headers() -> None:
    health = UpstreamHealth()
    health.record_success("hosted", {"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "0",
                                     "x-ratelimit-reset-tokens": "6s"})
    assert 0.0 < health.pause_left("hosted") <= 0.006  # 6 s / 1000 tokens: until one more fits
    anthropic = UpstreamHealth()
    anthropic.record_success("claude", {"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "0",
                                        "anthropic-ratelimit-requests-reset": "2099-01-01T00:00:00Z"})
    assert anthropic.pause_left("claude") > 0


def test_a_success_with_room_left_pauses_nothing() -> None:
    health = UpstreamHealth()
    health.record_success("hosted", {"x-ratelimit-limit-requests": "10000", "x-ratelimit-remaining-requests": "9999",
                                     "x-ratelimit-reset-requests": "6ms", "x-ratelimit-remaining-tokens": "1998000"})
    assert health.pause_left("hosted") == 0.0
