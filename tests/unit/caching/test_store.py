from __future__ import annotations

import asyncio

import pytest

from gateway.caching.store import CacheStore, MemoryStore

NS = "resp:{t:acme}"
OTHER = "resp:{t:globex}"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry_size(namespace: str, key: str, value: bytes) -> int:
    return len(namespace.encode()) + len(key.encode()) + len(value)


def test_memory_store_satisfies_the_protocol() -> None:
    store: CacheStore = MemoryStore(max_bytes=1024)
    assert store is not None


def test_get_returns_what_was_set_per_namespace() -> None:
    async def scenario() -> None:
        store = MemoryStore(max_bytes=10_000)
        await store.set(NS, "k", b"acme's answer", ttl_s=60)
        await store.set(OTHER, "k", b"globex's answer", ttl_s=60)
        assert await store.get(NS, "k") == b"acme's answer"
        assert await store.get(OTHER, "k") == b"globex's answer"
        assert await store.get(NS, "missing") is None

    asyncio.run(scenario())


def test_total_bytes_never_exceed_the_bound_and_least_recently_used_goes_first() -> None:
    async def scenario() -> None:
        value = b"x" * 20
        one = entry_size(NS, "a", value)
        store = MemoryStore(max_bytes=3 * one)
        for key in "abc":
            await store.set(NS, key, value, ttl_s=60)
        assert store.size_bytes == 3 * one and len(store) == 3
        assert await store.get(NS, "a") == value  # a is now the most recently used
        await store.set(NS, "d", value, ttl_s=60)  # must evict one: b, the least recently used
        assert store.size_bytes <= store.max_bytes
        assert await store.get(NS, "b") is None
        assert [await store.get(NS, k) is not None for k in "acd"] == [True, True, True]
        await store.set(NS, "e", b"y" * (2 * one - len(NS) - 1), ttl_s=60)  # needs two slots: c then a go
        assert store.size_bytes <= store.max_bytes
        assert await store.get(NS, "c") is None and await store.get(NS, "a") is None
        assert await store.get(NS, "d") == value

    asyncio.run(scenario())


def test_many_writes_stay_within_the_bound() -> None:
    async def scenario() -> None:
        store = MemoryStore(max_bytes=5_000)
        for i in range(2_000):
            await store.set(NS, f"key-{i}", b"v" * (i % 97), ttl_s=60)
            assert store.size_bytes <= 5_000
        assert await store.get(NS, "key-1999") == b"v" * (1999 % 97)  # the newest survives

    asyncio.run(scenario())


def test_an_entry_larger_than_the_whole_cache_is_not_stored_and_drops_the_stale_value() -> None:
    async def scenario() -> None:
        store = MemoryStore(max_bytes=100)
        await store.set(NS, "k", b"small", ttl_s=60)
        await store.set(NS, "k", b"z" * 200, ttl_s=60)
        assert await store.get(NS, "k") is None
        assert store.size_bytes == 0 and len(store) == 0

    asyncio.run(scenario())


def test_overwrite_replaces_the_value_and_its_size() -> None:
    async def scenario() -> None:
        store = MemoryStore(max_bytes=1_000)
        await store.set(NS, "k", b"a" * 50, ttl_s=60)
        await store.set(NS, "k", b"b" * 10, ttl_s=60)
        assert await store.get(NS, "k") == b"b" * 10
        assert store.size_bytes == entry_size(NS, "k", b"b" * 10)

    asyncio.run(scenario())


def test_entries_expire_after_their_ttl() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        store = MemoryStore(max_bytes=1_000, clock=clock)
        await store.set(NS, "short", b"1", ttl_s=10)
        await store.set(NS, "long", b"2", ttl_s=100)
        clock.now += 9.9
        assert await store.get(NS, "short") == b"1"
        clock.now += 0.1
        assert await store.get(NS, "short") is None
        assert await store.get(NS, "long") == b"2"
        assert len(store) == 1 and store.size_bytes == entry_size(NS, "long", b"2")  # expired entry freed
        clock.now += 100
        assert await store.get(NS, "long") is None

    asyncio.run(scenario())


def test_delete_namespace_drops_only_that_namespace_and_frees_its_bytes() -> None:
    async def scenario() -> None:
        store = MemoryStore(max_bytes=10_000)
        search, fetch = "tool:{t:acme}:search", "tool:{t:acme}:fetch"
        for key in ("1:a", "1:b", "2:a"):
            await store.set(search, key, b"result", ttl_s=60)
        await store.set(fetch, "1:a", b"page", ttl_s=60)
        await store.set("tool:{t:globex}:search", "1:a", b"theirs", ttl_s=60)
        assert await store.delete_namespace(search) == 3
        assert [await store.get(search, k) for k in ("1:a", "1:b", "2:a")] == [None, None, None]
        assert await store.get(fetch, "1:a") == b"page"
        assert await store.get("tool:{t:globex}:search", "1:a") == b"theirs"
        assert len(store) == 2
        assert await store.delete_namespace(search) == 0
        await store.set(search, "1:a", b"fresh", ttl_s=60)  # usable again afterwards
        assert await store.get(search, "1:a") == b"fresh"

    asyncio.run(scenario())


@pytest.mark.parametrize("namespace", ["resp", "resp:acme", "resp:{}", "resp:{acme", "resp:}acme{", "resp:{acme}#x"])
def test_a_namespace_without_a_tenant_scope_is_refused(namespace: str) -> None:
    async def scenario() -> None:
        store = MemoryStore(max_bytes=1_000)
        with pytest.raises(ValueError):
            await store.set(namespace, "k", b"v", ttl_s=60)
        with pytest.raises(ValueError):
            await store.get(namespace, "k")
        with pytest.raises(ValueError):
            await store.delete_namespace(namespace)

    asyncio.run(scenario())


@pytest.mark.parametrize("ttl", [0, -1, float("nan")])
def test_a_ttl_that_is_not_positive_is_refused(ttl: float) -> None:
    with pytest.raises(ValueError):
        asyncio.run(MemoryStore(max_bytes=1_000).set(NS, "k", b"v", ttl_s=ttl))
