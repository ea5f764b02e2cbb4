"""RedisBuckets against a real Redis: the shared bucket contract, the key layout, and
exactness when several OS processes hammer the same buckets at once."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.admission.buckets import Buckets
from gateway.admission.redis_buckets import RedisBuckets
from gateway.types.limits import BucketSpec
from tests.integration.admission.hammer import TakeTuple, hammer
from tests.unit.admission import contract

pytestmark = pytest.mark.services


def run_with_buckets(redis_prefix: tuple[str, str], check: Callable[[RedisBuckets], Coroutine[Any, Any, None]]) -> None:
    url, prefix = redis_prefix

    async def main() -> None:
        client = aioredis.Redis.from_url(url)
        try:
            await check(RedisBuckets(client, prefix=prefix))
        finally:
            await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("check", contract.CHECKS, ids=lambda check: check.__name__)
def test_contract(redis_prefix: tuple[str, str], check: Callable[[Buckets], Coroutine[Any, Any, None]]) -> None:
    run_with_buckets(redis_prefix, check)


def test_keys_carry_the_scope_as_hash_tag_and_expire(redis_prefix: tuple[str, str]) -> None:
    url, prefix = redis_prefix
    rpm = BucketSpec("tenant:acme:rpm", capacity=60, refill_per_s=1.0, scope="tenant:acme")
    tpm = BucketSpec("tenant:acme:tpm", capacity=6000, refill_per_s=100.0, scope="tenant:acme")

    async def check(buckets: RedisBuckets) -> None:
        assert buckets.redis_key(rpm) == f"{prefix}:{{tenant:acme}}:bucket:rpm"
        assert (await buckets.take([(rpm, 30), (tpm, 6000)])).granted

    run_with_buckets(redis_prefix, check)
    sync = redis.Redis.from_url(url)
    try:
        rpm_key, tpm_key = f"{prefix}:{{tenant:acme}}:bucket:rpm", f"{prefix}:{{tenant:acme}}:bucket:tpm"
        # One slot per scope: what lets one script touch them all on Redis Cluster too.
        assert key_slot(rpm_key.encode()) == key_slot(tpm_key.encode()) == key_slot(b"tenant:acme")
        # Twice the full-refill time: 2 x 60 s for both (capacity / refill).
        assert 118_000 < sync.pttl(rpm_key) <= 120_000
        assert 118_000 < sync.pttl(tpm_key) <= 120_000
    finally:
        sync.close()


def test_a_refunded_bucket_that_is_full_again_leaves_no_key(redis_prefix: tuple[str, str]) -> None:
    url, prefix = redis_prefix
    rpm = BucketSpec("tenant:acme:rpm", capacity=10, refill_per_s=1e-9, scope="tenant:acme")

    async def check(buckets: RedisBuckets) -> None:
        assert (await buckets.take([(rpm, 3)])).granted
        await buckets.adjust(rpm, 3)
        assert await buckets.peek(rpm) == (pytest.approx(10), 0.0)

    run_with_buckets(redis_prefix, check)
    sync = redis.Redis.from_url(url)
    try:
        assert sync.exists(f"{prefix}:{{tenant:acme}}:bucket:rpm") == 0
    finally:
        sync.close()


def test_refill_uses_the_redis_servers_clock(redis_prefix: tuple[str, str]) -> None:
    rpm = BucketSpec("tenant:acme:rpm", capacity=5, refill_per_s=20.0, scope="tenant:acme")

    async def check(buckets: RedisBuckets) -> None:
        assert (await buckets.take([(rpm, 5)])).granted
        refused = await buckets.take([(rpm, 1)])
        assert not refused.granted and 0 < refused.wait_s <= 0.05
        await asyncio.sleep(refused.wait_s + 0.02)
        assert (await buckets.take([(rpm, 1)])).granted

    run_with_buckets(redis_prefix, check)


def hammer_from_processes(redis_prefix: tuple[str, str], processes: int, takes: list[TakeTuple], attempts: int) -> list[int]:
    """Run `processes` spawned workers released together; return each one's granted count."""
    url, prefix = redis_prefix
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=hammer, args=(url, prefix, takes, attempts, 16, start, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        counts = [results.get(timeout=120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
    assert all(isinstance(count, int) for count in counts), counts
    assert all(worker.exitcode == 0 for worker in workers)
    return counts


@pytest.mark.parametrize("processes", [2, 3])
def test_processes_hammering_one_bucket_get_exactly_its_capacity(redis_prefix: tuple[str, str], processes: int) -> None:
    attempts = 200
    # More than the other processes can take between them, less than all ask for: even a
    # process that starts last is granted some, and together they are refused some.
    capacity = attempts * (processes - 1) + attempts // 2
    rpm: TakeTuple = ("tenant:acme:rpm", capacity, 1e-9, "tenant:acme", 1.0)
    counts = hammer_from_processes(redis_prefix, processes, [rpm], attempts=attempts)
    assert sum(counts) == capacity  # never more granted than the bucket held
    assert all(count > 0 for count in counts)  # they really did compete

    async def check(buckets: RedisBuckets) -> None:
        remaining, _ = await buckets.peek(BucketSpec(*rpm[:4]))
        assert remaining == pytest.approx(0, abs=1e-6)  # nothing went negative

    run_with_buckets(redis_prefix, check)


def test_cross_scope_refusals_under_contention_leak_nothing(redis_prefix: tuple[str, str]) -> None:
    # The model scope sorts first, so every refusal by the (binding) tenant bucket is a
    # model deduction that must be refunded; afterwards the model must show exactly the
    # granted requests' tokens taken, no more.
    tenant: TakeTuple = ("tenant:acme:rpm", 40, 1e-9, "tenant:acme", 1.0)
    model: TakeTuple = ("model:gpt-x:tpm", 100_000, 1e-9, "model:gpt-x", 100.0)
    counts = hammer_from_processes(redis_prefix, 3, [tenant, model], attempts=150)
    assert sum(counts) == 40

    async def check(buckets: RedisBuckets) -> None:
        assert (await buckets.peek(BucketSpec(*tenant[:4])))[0] == pytest.approx(0, abs=1e-6)
        assert (await buckets.peek(BucketSpec(*model[:4])))[0] == pytest.approx(100_000 - 40 * 100, abs=1e-3)

    run_with_buckets(redis_prefix, check)


def test_prefix_with_braces_is_rejected(redis_prefix: tuple[str, str]) -> None:
    client = aioredis.Redis.from_url(redis_prefix[0])
    with pytest.raises(ValueError, match="braces"):
        RedisBuckets(client, prefix="gw{x}")
