"""A worker process for the exactness tests: its own asyncio loop, Redis connection pool
and RedisBuckets, taking from shared buckets as fast as it can for a fixed number of
attempts. Lives in its own module so the spawn start method can import it."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as redis

from gateway.admission.redis_buckets import RedisBuckets
from gateway.types.limits import BucketSpec

# (key, capacity, refill_per_s, scope, amount): plain tuples cross the process boundary.
TakeTuple = tuple[str, float, float, str, float]


def hammer(redis_url: str, prefix: str, takes: list[TakeTuple], attempts: int, concurrency: int, start: Any, results: Any) -> None:
    try:
        results.put(asyncio.run(_hammer(redis_url, prefix, takes, attempts, concurrency, start)))
    except BaseException as exc:  # report, so the parent fails with the reason instead of a timeout
        results.put(repr(exc))
        raise


async def _hammer(redis_url: str, prefix: str, takes: list[TakeTuple], attempts: int, concurrency: int, start: Any) -> int:
    client = redis.Redis.from_url(redis_url, max_connections=concurrency)
    try:
        buckets = RedisBuckets(client, prefix=prefix)
        specs = [(BucketSpec(key, capacity, refill, scope), amount) for key, capacity, refill, scope, amount in takes]
        await client.ping()  # connect (and import everything) before the start line
        await asyncio.to_thread(start.wait, 60)
        remaining = iter(range(attempts))
        granted = 0

        async def worker() -> None:
            nonlocal granted
            for _ in remaining:
                result = await buckets.take(specs)  # awaited first: `granted += await ...` would lose updates
                granted += result.granted

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return granted
    finally:
        await client.aclose()
