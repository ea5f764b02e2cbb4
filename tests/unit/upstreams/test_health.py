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
