"""OpenAI-style prompt caching: 1024-token minimum, 128-token increments, scoped."""

from __future__ import annotations

from gateway.sim.hosted_cache import HostedPromptCache


def test_short_prompts_are_never_cached() -> None:
    cache = HostedPromptCache()
    tokens = list(range(1000))
    assert cache.lookup_and_store("m", tokens) == 0
    assert cache.lookup_and_store("m", tokens) == 0


def test_longest_seen_prefix_in_128_token_steps() -> None:
    cache = HostedPromptCache()
    base = list(range(1300))
    assert cache.lookup_and_store("m", base) == 0
    assert cache.lookup_and_store("m", base) == 1280  # 1024 + 2 * 128
    extended = [*base, *range(5000, 5500)]
    assert cache.lookup_and_store("m", extended) == 1280
    assert cache.lookup_and_store("m", extended) == 1792
    diverged = [*base[:1100], *range(7000, 7300)]
    assert cache.lookup_and_store("m", diverged) == 1024


def test_scopes_do_not_share() -> None:
    cache = HostedPromptCache()
    tokens = list(range(2000))
    cache.lookup_and_store("m\x00tenant-a", tokens)
    assert cache.lookup_and_store("m\x00tenant-b", tokens) == 0


def test_lru_bound() -> None:
    cache = HostedPromptCache(max_entries=3)
    first = list(range(1024))
    cache.lookup_and_store("m", first)
    for i in range(3):
        cache.lookup_and_store("m", list(range(10_000 * (i + 1), 10_000 * (i + 1) + 1024)))
    assert cache.lookup_and_store("m", first) == 0
