"""Keeps one pooled client per configured upstream across policy reloads: unchanged
upstreams keep their warm connections; replaced ones are closed once idle."""

from __future__ import annotations

import asyncio

from gateway.routing.policy import Policy
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.anthropic import AnthropicUpstream
from gateway.upstreams.http import HttpUpstream

RETIRE_AFTER_S = 30.0


class UpstreamRegistry:
    def __init__(self) -> None:
        self._live: dict[str, HttpUpstream] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    def get(self, name: str) -> HttpUpstream:
        return self._live[name]

    def sync(self, policy: Policy) -> None:
        fresh: dict[str, HttpUpstream] = {}
        for name, config in policy.upstreams.items():
            current = self._live.get(name)
            fresh[name] = current if current is not None and _same(current.config, config) else _new(name, config)
        retired = [u for name, u in self._live.items() if fresh.get(name) is not u]
        self._live = fresh
        for upstream in retired:
            self._retire(upstream)

    def _retire(self, upstream: HttpUpstream) -> None:
        # In-flight requests still hold the old client; give them time to finish.
        async def close_later() -> None:
            await asyncio.sleep(RETIRE_AFTER_S)
            await upstream.aclose()

        try:
            task = asyncio.get_running_loop().create_task(close_later())
        except RuntimeError:
            return
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def aclose(self) -> None:
        for task in self._retiring:
            task.cancel()
        for upstream in self._live.values():
            await upstream.aclose()
        self._live = {}


def _same(a: UpstreamConfig, b: UpstreamConfig) -> bool:
    return a == b


def _new(name: str, config: UpstreamConfig) -> HttpUpstream:
    return AnthropicUpstream(name, config) if config.kind == "anthropic" else HttpUpstream(name, config)
