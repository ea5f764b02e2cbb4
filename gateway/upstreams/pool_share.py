"""Prefix homes agreed by every gateway replica through Redis, when one is configured.

Each gateway computes homes from the traffic it routed, and gateways that each see a
random part of the traffic agree where their counts do (prefix_homes.py), which in a
short or thin window is not everywhere. With Redis, every gateway publishes its recent
traffic per prefix once a scrape interval; one of them, holding a short lease, assigns
homes from the sum and publishes them; the others adopt them. A gateway that loses
Redis goes back to its own counts. All keys of a pool share one hash tag, so this runs
on Redis Cluster too."""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING

from gateway.routing.prefix_homes import Prefix
from gateway.upstreams.pool import Pool

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("gateway.pool")
MIN_LEASE_MS = 3000


class SharedHomes:
    def __init__(self, redis: Redis, prefix: str, gateway_id: str | None = None) -> None:
        from redis.exceptions import RedisError

        self.redis = redis
        self.prefix = prefix
        self.gateway_id = gateway_id or secrets.token_hex(8)
        self._errors: tuple[type[Exception], ...] = (RedisError, OSError)
        self.leading: dict[str, bool] = {}

    async def sync(self, pool: Pool) -> None:
        """Publish this gateway's traffic, then assign (as leader) or adopt the homes;
        on a Redis failure, assign them from this gateway's own traffic."""
        try:
            await self._sync(pool)
        except self._errors as exc:
            log.warning("pool %s: homes not shared (%s); placing by this gateway's own traffic", pool.name, type(exc).__name__)
            pool.rebalance()

    async def _sync(self, pool: Pool) -> None:
        base = f"{self.prefix}:{{pool:{pool.name}}}"
        lease_ms = max(MIN_LEASE_MS, int(pool.settings.scrape_interval_s * 5000))
        now_ms = int(time.time() * 1000)
        mine = pool.homes.prefixes(time.monotonic())
        pipe = self.redis.pipeline(transaction=False)
        rates = f"{base}:rates:{self.gateway_id}"
        pipe.delete(rates)
        if mine:
            pipe.hset(rates, mapping={key.hex(): f"{p.weight:.6f} {p.blocks:.3f}" for key, p in mine.items()})
            pipe.pexpire(rates, lease_ms * 2)
        pipe.zadd(f"{base}:members", {self.gateway_id: now_ms})
        pipe.zremrangebyscore(f"{base}:members", "-inf", now_ms - lease_ms * 2)
        pipe.set(f"{base}:leader", self.gateway_id, nx=True, px=lease_ms)
        pipe.get(f"{base}:leader")
        *_, leader = await pipe.execute()
        leading = leader is not None and _text(leader) == self.gateway_id
        self.leading[pool.name] = leading
        if leading:
            await self._lead(pool, base, lease_ms)
        else:
            await self._follow(pool, base)

    async def _lead(self, pool: Pool, base: str, lease_ms: int) -> None:
        await self.redis.pexpire(f"{base}:leader", lease_ms)
        members = [_text(m) for m in await self.redis.zrange(f"{base}:members", 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for member in members:
            pipe.hgetall(f"{base}:rates:{member}")
        merged: dict[bytes, tuple[float, float]] = {}
        for rates in await pipe.execute():
            for raw_key, raw_value in rates.items():
                weight, blocks = (float(v) for v in _text(raw_value).split())
                key = bytes.fromhex(_text(raw_key))
                total, size = merged.get(key, (0.0, 0.0))
                merged[key] = (total + weight, size + weight * blocks)
        prefixes = {key: Prefix(w, size / w if w else 0.0) for key, (w, size) in merged.items()}
        homes = pool.homes.rebalance_from(prefixes, pool.kv_for_homes(), pool.settings.home_share_factor)
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(f"{base}:homes")
        if homes:
            pipe.hset(f"{base}:homes", mapping={key.hex(): url for key, url in homes.items()})
            pipe.pexpire(f"{base}:homes", lease_ms * 10)
        await pipe.execute()

    async def _follow(self, pool: Pool, base: str) -> None:
        shared = await self.redis.hgetall(f"{base}:homes")
        if not shared:
            pool.rebalance()  # no leader has published yet
            return
        pool.homes.adopt({bytes.fromhex(_text(k)): _text(v) for k, v in shared.items()})


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
