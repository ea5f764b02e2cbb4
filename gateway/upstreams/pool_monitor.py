"""The pools' stats scraper: about once a `scrape_interval_s`, each replica's `/health`
(a failure takes it out, a 200 brings it back) and `/metrics` (load, KV use, cache
geometry, latency sums), then the prefixes' homes are reassigned from recent traffic
(this gateway's, or with Redis every gateway's: pool_share.py). One task for every
pool, started in the app's lifespan."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from gateway.errors import GatewayError
from gateway.upstreams.http import HttpUpstream
from gateway.upstreams.pool import Replica
from gateway.upstreams.pool_metrics import parse_replica_metrics
from gateway.upstreams.pool_share import SharedHomes
from gateway.upstreams.registry import UpstreamRegistry

log = logging.getLogger("gateway.pool")
IDLE_TICK_S = 1.0


def replica_root(url: str) -> str:
    """Replicas are configured by their OpenAI base (`.../v1`); /health and /metrics live at the root."""
    return url.rstrip("/").removesuffix("/v1")


class PoolMonitor:
    def __init__(self, registry: UpstreamRegistry, shared: SharedHomes | None = None) -> None:
        self.registry = registry
        self.shared = shared  # homes agreed through Redis, when configured
        self._due: dict[str, float] = {}

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # a failed round is tried again next tick, never fatal
                log.exception("pool scrape failed")
            await asyncio.sleep(self._tick_s())

    def _tick_s(self) -> float:
        intervals = [u.pool.settings.scrape_interval_s for u in self.registry.pools() if u.pool is not None]
        return min(intervals, default=IDLE_TICK_S)

    async def tick(self) -> None:
        now = time.monotonic()
        due = []
        for upstream in self.registry.pools():
            assert upstream.pool is not None
            if now >= self._due.get(upstream.name, 0.0):
                # Due again one interval on, less a little: ticks land just after it.
                self._due[upstream.name] = now + upstream.pool.settings.scrape_interval_s * 0.9
                due.append(self.scrape(upstream))
        await asyncio.gather(*due)

    async def scrape(self, upstream: HttpUpstream) -> None:
        pool = upstream.pool
        assert pool is not None
        await asyncio.gather(*(self.probe(upstream, replica) for replica in list(pool.replicas.values())))
        if self.shared is not None:
            await self.shared.sync(pool)
        else:
            pool.rebalance()

    async def probe(self, upstream: HttpUpstream, replica: Replica) -> None:
        pool = upstream.pool
        assert pool is not None
        root = replica_root(replica.url)
        try:
            status, _ = await upstream.fetch_text(root + "/health")
            if status != 200:
                pool.probed(replica, False, None, f"/health answered {status}")
                return
            status, text = await upstream.fetch_text(root + "/metrics")
        except (aiohttp.ClientError, TimeoutError, GatewayError) as exc:
            pool.probed(replica, False, None, f"/health failed: {type(exc).__name__}")
            return
        pool.probed(replica, True, parse_replica_metrics(text) if status == 200 else None)
