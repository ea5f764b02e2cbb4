"""Keeps one pooled client per configured upstream across policy reloads: unchanged
upstreams keep their warm connections; replaced ones are closed once their requests in
flight have finished. A vLLM pool's state (replica health and stats, prefix index,
homes) outlives an edit of its upstream: replicas the edit keeps keep their picture,
replicas it removes drain."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.routing.policy import Policy
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.anthropic import AnthropicUpstream
from gateway.upstreams.base import Upstream
from gateway.upstreams.http import HttpUpstream
from gateway.upstreams.pool import Pool

# A request may look its upstream up just before a reload and call it just after.
RETIRE_GRACE_S = 1.0


class UpstreamRegistry:
    def __init__(self) -> None:
        self._live: dict[str, HttpUpstream] = {}
        self._retiring: dict[asyncio.Task[None], HttpUpstream] = {}

    def get(self, name: str) -> Upstream:
        return self._live[name]

    def pools(self) -> list[HttpUpstream]:
        """The live upstreams that are self-hosted pools."""
        return [u for u in self._live.values() if u.pool is not None]

    def sync(self, policy: Policy) -> None:
        fresh: dict[str, HttpUpstream] = {}
        for name, config in policy.upstreams.items():
            current = self._live.get(name)
            if current is not None and _same(current.config, config):
                fresh[name] = current
                continue
            pool = current.pool if current is not None and current.pool is not None and config.kind == "vllm" else None
            if pool is not None:
                pool.reconfigure(config)
            fresh[name] = _new(name, config, pool)
        retired = [u for name, u in self._live.items() if fresh.get(name) is not u]
        self._live = fresh
        for upstream in retired:
            successor = fresh.get(upstream.name)
            if upstream.pool is not None and (successor is None or successor.pool is not upstream.pool):
                upstream.pool.drain_all()  # its replicas finish what they have, with the old client
            self._retire(upstream)

    def _retire(self, upstream: HttpUpstream) -> None:
        # In-flight requests still hold the old client: close it once they are done.
        async def close_when_idle() -> None:
            await asyncio.sleep(RETIRE_GRACE_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(upstream.wait_idle(), timeout=upstream.config.timeout_s)
            await upstream.aclose()

        try:
            task = asyncio.get_running_loop().create_task(close_when_idle())
        except RuntimeError:
            return
        self._retiring[task] = upstream
        task.add_done_callback(lambda done: self._retiring.pop(done, None))

    async def aclose(self) -> None:
        for task, retired in list(self._retiring.items()):
            task.cancel()
            await retired.aclose()
        for upstream in self._live.values():
            await upstream.aclose()
        self._live = {}


def _same(a: UpstreamConfig, b: UpstreamConfig) -> bool:
    return a == b


def _new(name: str, config: UpstreamConfig, pool: Pool | None) -> HttpUpstream:
    return AnthropicUpstream(name, config) if config.kind == "anthropic" else HttpUpstream(name, config, pool)
