"""RedisStore against a real Redis: what one replica writes or invalidates, another sees."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as redis
from redis.crc import key_slot

from gateway.caching.keys import cache_key, canonical_request, response_namespace, tenant_scope, tool_namespace
from gateway.caching.redis_store import RedisStore

pytestmark = pytest.mark.services

ACME = response_namespace(tenant_scope("acme"))
SEARCH = tool_namespace(tenant_scope("acme"), "search")


def with_replicas(redis_prefix: tuple[str, str], scenario: Callable[[RedisStore, RedisStore, redis.Redis], Awaitable[None]]) -> None:
    """Run `scenario` with two stores on separate connections (two gateway replicas)."""
    url, prefix = redis_prefix

    async def main() -> None:
        first, second = redis.Redis.from_url(url), redis.Redis.from_url(url)
        try:
            await scenario(RedisStore(first, prefix=prefix), RedisStore(second, prefix=prefix), first)
        finally:
            await first.aclose()
            await second.aclose()

    asyncio.run(main())


def test_set_get_and_binary_values(redis_prefix: tuple[str, str]) -> None:
    async def scenario(one: RedisStore, two: RedisStore, client: redis.Redis) -> None:
        value = b'{"choices": []}\x00:\xff binary-safe'
        await one.set(ACME, "k1", value, ttl_s=60)
        assert await one.get(ACME, "k1") == value
        assert await two.get(ACME, "k1") == value
        assert await two.get(ACME, "missing") is None
        assert await two.get(response_namespace(tenant_scope("globex")), "k1") is None

    with_replicas(redis_prefix, scenario)


def test_entries_expire_after_their_ttl(redis_prefix: tuple[str, str]) -> None:
    async def scenario(one: RedisStore, two: RedisStore, client: redis.Redis) -> None:
        await one.set(ACME, "short", b"v", ttl_s=0.3)
        await one.set(ACME, "long", b"v", ttl_s=60)
        ttl_ms = await client.pttl(one.entry_key(ACME, "long"))
        assert 59_000 < ttl_ms <= 60_000
        assert await two.get(ACME, "short") == b"v"
        await asyncio.sleep(0.45)
        assert await two.get(ACME, "short") is None
        assert await two.get(ACME, "long") == b"v"

    with_replicas(redis_prefix, scenario)


def test_invalidating_a_namespace_is_seen_by_another_replica_at_once(redis_prefix: tuple[str, str]) -> None:
    async def scenario(one: RedisStore, two: RedisStore, client: redis.Redis) -> None:
        fetch = tool_namespace(tenant_scope("acme"), "fetch")
        theirs = tool_namespace(tenant_scope("globex"), "search")
        for key in ("1:a", "1:b"):
            await one.set(SEARCH, key, b"old result", ttl_s=60)
        await one.set(fetch, "1:a", b"page", ttl_s=60)
        await one.set(theirs, "1:a", b"their result", ttl_s=60)
        assert await two.get(SEARCH, "1:a") == b"old result"

        await two.delete_namespace(SEARCH)  # replica two invalidates

        assert await one.get(SEARCH, "1:a") is None  # replica one sees it on its next read
        assert await one.get(SEARCH, "1:b") is None
        assert await one.get(fetch, "1:a") == b"page"
        assert await one.get(theirs, "1:a") == b"their result"
        await one.set(SEARCH, "1:a", b"new result", ttl_s=60)  # and the namespace works again
        assert await two.get(SEARCH, "1:a") == b"new result"
        assert await two.get(SEARCH, "1:b") is None

    with_replicas(redis_prefix, scenario)


def test_a_lost_generation_key_never_revives_old_entries(redis_prefix: tuple[str, str]) -> None:
    async def scenario(one: RedisStore, two: RedisStore, client: redis.Redis) -> None:
        await one.set(SEARCH, "1:a", b"old", ttl_s=60)
        await client.delete(one.generation_key(SEARCH))  # e.g. evicted under memory pressure
        assert await two.get(SEARCH, "1:a") is None
        await two.set(SEARCH, "1:b", b"new", ttl_s=60)
        assert await one.get(SEARCH, "1:a") is None
        assert await one.get(SEARCH, "1:b") == b"new"

    with_replicas(redis_prefix, scenario)


def test_every_key_carries_the_tenant_hash_tag_and_no_prompt_text(redis_prefix: tuple[str, str]) -> None:
    _, prefix = redis_prefix

    async def scenario(one: RedisStore, two: RedisStore, client: redis.Redis) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "my secret prompt"}], "temperature": 0}
        digest = cache_key(b"secret", tenant_scope("acme"), canonical_request("chat.completions", "gpt-4o-mini", body))
        await one.set(ACME, digest, b"answer", ttl_s=60)
        await one.set(SEARCH, f"1:{digest}", b"result", ttl_s=60)
        await one.delete_namespace(SEARCH)
        keys = sorted([k.decode() async for k in client.scan_iter(match=f"{prefix}:*")])
        assert keys == sorted([
            f"{prefix}:resp:{{t:acme}}#{digest}", f"{prefix}:gen:resp:{{t:acme}}",
            f"{prefix}:tool:{{t:acme}}:search#1:{digest}", f"{prefix}:gen:tool:{{t:acme}}:search",
        ])
        assert len({key_slot(k.encode()) for k in keys}) == 1  # one tenant scope, one cluster slot
        assert all("secret prompt" not in k for k in keys)

    with_replicas(redis_prefix, scenario)


def test_a_client_that_decodes_responses_is_refused(redis_prefix: tuple[str, str]) -> None:
    url, prefix = redis_prefix

    async def main() -> None:
        client = redis.Redis.from_url(url, decode_responses=True)
        try:
            with pytest.raises(ValueError, match="decode_responses"):
                RedisStore(client, prefix=prefix)
        finally:
            await client.aclose()

    asyncio.run(main())
