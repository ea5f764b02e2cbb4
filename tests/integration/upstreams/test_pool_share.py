"""Two gateway replicas agreeing on the pool's prefix homes through a real Redis: each
routes a random half of the traffic, yet both send every prefix to the same replica;
without Redis each places by what it saw itself."""

from __future__ import annotations

import asyncio
import random

from redis.asyncio import Redis

from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.base import PoolRequest
from gateway.upstreams.pool import Pool
from gateway.upstreams.pool_share import SharedHomes

URLS = [f"http://r{i}:8000/v1" for i in range(4)]
SYSTEMS = [f"You are the assistant of tenant {t}. " + " ".join(f"rule {t}.{n} holds." for n in range(40)) for t in range(20)]


def request(tenant: int) -> PoolRequest:
    return PoolRequest(f"t{tenant}", f"system\x00{SYSTEMS[tenant]}\x00user\x00q\x00", f"salt-{tenant}", 1e12)


def test_two_gateways_adopt_the_same_homes_through_redis(redis_prefix: tuple[str, str]) -> None:
    url, prefix = redis_prefix

    async def scenario() -> None:
        config = UpstreamConfig.model_validate({"kind": "vllm", "replicas": URLS})
        pools = [Pool("pool", config), Pool("pool", config)]
        redis = Redis.from_url(url)
        shared = [SharedHomes(redis, prefix, "gw-a"), SharedHomes(redis, prefix, "gw-b")]
        rng = random.Random(4)
        weights = [1 / (t + 1) ** 0.6 for t in range(20)]
        try:
            for _ in range(3):
                for _ in range(400):
                    pool = rng.choice(pools)
                    pool.finished(pool.choose(request(rng.choices(range(20), weights)[0])))
                for pool, share in zip(pools, shared, strict=True):
                    await share.sync(pool)
            await shared[0].sync(pools[0])  # the leader's latest homes, then the follower's copy
            await shared[1].sync(pools[1])
            assert sum(s.leading["pool"] for s in shared) == 1, "one leader"
            homes = [dict(p.homes.homes()) for p in pools]
            assert len(homes[0]) == 20 and homes[0] == homes[1]
            sent = [{p.choose(request(t)).url for p in pools} for t in range(20)]
            assert all(len(urls) == 1 for urls in sent), "each tenant to one replica, whichever gateway routes it"
        finally:
            await redis.aclose()

    asyncio.run(scenario())


def test_a_gateway_that_loses_redis_places_by_its_own_traffic() -> None:
    async def scenario() -> None:
        pool = Pool("pool", UpstreamConfig.model_validate({"kind": "vllm", "replicas": URLS}))
        for t in range(20):
            pool.finished(pool.choose(request(t)))
        dead = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
        try:
            await SharedHomes(dead, "x").sync(pool)
        finally:
            await dead.aclose()
        assert len(pool.homes.homes()) == 20

    asyncio.run(scenario())
