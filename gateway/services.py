"""Everything a running gateway holds, built once in the app's lifespan and passed in:
no module-level state anywhere else."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from gateway.caching.salts import TenantSalts, load_or_create_secret
from gateway.pipeline.runner import Pipeline
from gateway.routing.reload import PolicyHolder
from gateway.settings import Settings
from gateway.telemetry.metrics import Metrics
from gateway.upstreams.registry import UpstreamRegistry


@dataclass
class Services:
    settings: Settings
    policies: PolicyHolder
    upstreams: UpstreamRegistry
    metrics: Metrics
    pipeline: Pipeline
    started_at: float = field(default_factory=time.time)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def build(cls, settings: Settings) -> Services:
        if settings.gateway_policy is None:
            raise ValueError("no policy file: pass --policy FILE or set GATEWAY_POLICY")
        metrics = Metrics()
        upstreams = UpstreamRegistry()
        policies = PolicyHolder(
            settings.gateway_policy,
            on_swap=lambda runtime: upstreams.sync(runtime.policy),
            on_result=lambda result: metrics.policy_reloads.labels(result).inc(),
        )
        salts = TenantSalts(load_or_create_secret(settings.gateway_secret, settings.gateway_var_dir))
        pipeline = Pipeline(policies, upstreams, metrics, salts)
        return cls(settings, policies, upstreams, metrics, pipeline)

    def start_background(self) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(self.policies.watch(self.settings.gateway_policy_poll_s)))

    async def readiness(self) -> dict[str, tuple[bool, str]]:
        """Each store the request path needs, with a short reason when it is not usable."""
        policy = self.policies.current
        detail = f"{len(policy.targets)} models from {policy.source}"
        if self.policies.last_error:
            detail += " (the latest edit was rejected; serving the last good policy)"
        return {"policy": (True, detail)}

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.upstreams.aclose()
