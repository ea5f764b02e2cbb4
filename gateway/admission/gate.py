"""Admission for the request path: a tenant's and a model's RPM/TPM buckets, a bounded
wait for capacity, an honest 429 beyond it, and the token count corrected with real
usage after the call. Upstream pacing uses the same buckets, scoped to the upstream."""

from __future__ import annotations

import logging
import time

from gateway.admission.buckets import TakeResult
from gateway.admission.limits import (
    RPM,
    TPM,
    model_specs,
    ratelimit_headers,
    request_takes,
    spec_kind,
    tenant_specs,
    upstream_specs,
)
from gateway.admission.queue import AdmissionQueue, Refused
from gateway.errors import NotReady, UpstreamTimeout
from gateway.request_context import RequestContext
from gateway.routing.resolved import ModelTarget, RuntimePolicy
from gateway.types.limits import Admitted, BucketSpec

BATCH = "batch"
log = logging.getLogger("gateway.admission")


def _first(specs: list[BucketSpec], kind: str) -> BucketSpec | None:
    return next((s for s in specs if spec_kind(s) == kind), None)


def _store_down(exc: Exception) -> NotReady:
    # Limits that cannot be checked are not waved through: a replica that admitted
    # blindly would multiply the limit by the replica count.
    return NotReady(f"the shared rate-limit store (Redis) is unreachable, so limits cannot be checked: {type(exc).__name__}")


class AdmissionGate:
    def __init__(self, queue: AdmissionQueue) -> None:
        self.queue = queue

    async def admit(self, ctx: RequestContext, policy: RuntimePolicy, priority_header: str | None) -> Admitted | None:
        tenant = policy.policy.tenants[ctx.tenant]
        model = policy.policy.models[ctx.targets[0].name]
        tenant_limit = tenant.limits
        specs = tenant_specs(ctx.tenant, tenant_limit.rpm, tenant_limit.tpm) if tenant_limit else []
        if model.limits is not None:
            specs += model_specs(ctx.targets[0].name, model.limits.rpm, model.limits.tpm)
        if not specs:
            return None
        tokens = await _request_tokens(ctx, specs)
        # A client may ask to be treated as batch traffic, never to jump the queue.
        priority = BATCH if priority_header == BATCH else tenant.priority
        own = [s for s in specs if s.scope == f"tenant:{ctx.tenant}"]
        try:
            result = await self.queue.admit(
                f"tenant:{ctx.tenant}", request_takes(specs, tokens),
                max_queue=tenant_limit.max_queue if tenant_limit else 64,
                max_wait_s=tenant_limit.max_wait_s if tenant_limit else 5.0,
                deadline=ctx.deadline, priority=priority)
        except Refused as refused:
            refused.headers.update(ratelimit_headers(refused.result, _first(own, RPM), _first(own, TPM)))
            raise
        except self.queue.unreachable as exc:
            raise _store_down(exc) from None
        ctx.response_headers.update(ratelimit_headers(result, _first(own, RPM), _first(own, TPM)))
        return Admitted(tokens, [s for s in specs if spec_kind(s) == TPM])

    async def settle(self, ctx: RequestContext, admitted: Admitted | None) -> None:
        """Give back what the request did not use (or take the overrun), once its real
        usage is known; while usage is unknown the estimate stands."""
        if admitted is None or not admitted.token_specs:
            return
        if any(a.usage is None and a.status not in ("error",) for a in ctx.attempts):
            return
        used = sum(a.usage.prompt_tokens + a.usage.completion_tokens for a in ctx.attempts if a.usage is not None)
        delta = admitted.tokens - used
        if delta:
            for spec in admitted.token_specs:
                try:
                    await self.queue.adjust(spec, delta)
                except self.queue.unreachable as exc:  # the answer is already out; the estimate stands
                    log.warning("could not correct %s by %+.0f tokens: %s", spec.key, delta, exc)

    async def pace_upstream(self, ctx: RequestContext, policy: RuntimePolicy, target: ModelTarget) -> TakeResult | None:
        """Wait (inside the deadline) for our share of the provider's limits."""
        limits = policy.policy.upstreams[target.upstream].limits
        if limits is None:
            return None
        specs = upstream_specs(target.upstream, limits.rpm, limits.tpm)
        tokens = await _request_tokens(ctx, specs)
        try:
            return await self.queue.admit(f"upstream:{target.upstream}", request_takes(specs, tokens), max_queue=1_000_000,
                                          max_wait_s=max(0.0, ctx.deadline - time.monotonic()), deadline=ctx.deadline)
        except self.queue.unreachable as exc:
            raise _store_down(exc) from None
        except Refused as refused:
            raise UpstreamTimeout(f"upstream `{target.upstream}`'s configured limits leave no room before this request's deadline "
                                  f"(next capacity in {refused.retry_after_s:.1f}s)") from None


async def _request_tokens(ctx: RequestContext, specs: list[BucketSpec]) -> float:
    """Tokens a token-per-minute limit charges up front: the counted prompt plus the
    output bound (corrected at settle). Only counted when such a limit applies."""
    if not any(spec_kind(s) == TPM for s in specs):
        return 0.0
    return float(await ctx.prompt.count() + ctx.max_output_tokens)
