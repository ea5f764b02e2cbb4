"""The one place that retries. An upstream call is tried against its target, retried
on failures that can pass (429, 5xx, timeouts, broken connections) after the delay the
provider asked for or a jittered backoff - never past the request's deadline, never
past the retry budgets - and then failed over to the next target the policy lists.
An upstream that does not know the model is neither retried nor held against it."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.errors import (
    AllUpstreamsFailed,
    GatewayError,
    ModelNotFound,
    PoolSpill,
    ReplicaFailed,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.request_context import Attempt, RequestContext
from gateway.routing.policy import Retry
from gateway.routing.resolved import ModelTarget
from gateway.upstreams.backoff import CONNECT, HTTP, QUOTA, TIMEOUT, RetryBudget, classify_http_error, is_retryable, retry_delay
from gateway.upstreams.health import UpstreamHealth
from gateway.upstreams.ratelimit_headers import parse_provider_limits

T = TypeVar("T")
TASK_BUDGETS = 10_000
log = logging.getLogger("gateway.upstreams")


class Retrier:
    def __init__(self, health: UpstreamHealth, rng: random.Random | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.health = health
        self._rng = rng or random.Random()
        self._sleep = sleep  # tests pass one that records the waits instead of waiting
        self._upstream_budgets: dict[str, RetryBudget] = {}
        self._task_budgets: OrderedDict[str, RetryBudget] = OrderedDict()

    def _budgets(self, ctx: RequestContext, upstream: str, config: Retry) -> list[RetryBudget]:
        shared = self._upstream_budgets.get(upstream)
        if shared is None:  # not `setdefault`: that would build a budget on every call, to drop it
            shared = self._upstream_budgets[upstream] = RetryBudget(ratio=config.budget_ratio)
        budgets = [shared]
        if ctx.task_id is not None:
            task = self._task_budgets.get(ctx.task_id)
            if task is None:
                task = self._task_budgets[ctx.task_id] = RetryBudget(ratio=config.budget_ratio)
                if len(self._task_budgets) > TASK_BUDGETS:
                    self._task_budgets.popitem(last=False)
            budgets.append(task)
        return budgets

    async def call(self, ctx: RequestContext, targets: list[ModelTarget], config: Retry,
                   send: Callable[[ModelTarget], Awaitable[tuple[Attempt, T]]]) -> tuple[Attempt, T]:
        """`send` makes one attempt and returns it with its result, or raises."""
        errors: list[GatewayError] = []
        for target in targets:
            cooling = await self.health.cooldown_left(target.upstream)
            if cooling > 0:
                errors.append(UpstreamError(f"upstream `{target.upstream}` is cooling down after repeated failures ({cooling:.1f}s left)"))
                continue
            request_budget = RetryBudget(max_attempts=config.max_attempts)
            shared = self._budgets(ctx, target.upstream, config)
            for number in range(config.max_attempts):
                await self._wait_for_learned_limit(ctx, target)
                is_retry = number > 0
                request_budget.record_attempt(is_retry)
                for budget in shared:
                    budget.record_attempt(is_retry)
                try:
                    result = await send(target)
                except PoolSpill as exc:
                    # The pool cannot serve it in time (or at all): straight to the fallback,
                    # no retry here and no mark against the pool, which recovers by itself.
                    errors.append(exc)
                    ctx.response_headers["x-gateway-spill"] = exc.reason
                    break
                except ModelNotFound as exc:
                    if exc.upstream_status is None:  # not the upstream's answer
                        raise
                    raise _not_served(ctx, target, exc) from None
                except GatewayError as exc:
                    errors.append(exc)
                    kind = _kind(exc)
                    if kind == QUOTA:  # out of money, not of rate: the client's retry would not help either
                        exc.headers["x-should-retry"] = "false"
                    if not exc.retryable or not is_retryable(exc.upstream_status, kind):
                        raise
                    replica_failed = isinstance(exc, ReplicaFailed)  # the pool took it out; another replica is ready
                    if exc.upstream_status != 429 and not replica_failed:  # a 429 is the provider pacing us
                        await self.health.record_failure(target.upstream, config.cooldown_after, config.cooldown_s)
                    limits = parse_provider_limits(exc.upstream_headers or {})
                    self.health.learn(target.upstream, limits)
                    if not (request_budget.allow() and all(b.allow() for b in shared)):
                        break
                    if replica_failed:
                        continue
                    delay = retry_delay(number, limits, base_s=config.base_s, cap_s=config.cap_s, rng=self._rng)
                    if time.monotonic() + delay >= ctx.deadline:
                        break  # waiting would overrun the deadline: fail over, or give up now
                    await self._sleep(delay)
                    continue
                self.health.record_success(target.upstream, result[0].limit_headers)
                return result
        raise _final_error(errors)

    async def _wait_for_learned_limit(self, ctx: RequestContext, target: ModelTarget) -> None:
        pause = self.health.pause_left(target.upstream)
        if pause <= 0:
            return
        if time.monotonic() + pause >= ctx.deadline:
            raise UpstreamTimeout(f"upstream `{target.upstream}` reported its limit exhausted for {pause:.1f}s, past this request's deadline")
        await self._sleep(pause)


def _not_served(ctx: RequestContext, target: ModelTarget, exc: ModelNotFound) -> ModelNotFound:
    """The upstream does not know the model it was sent: a name in the policy that the
    provider does not serve (a typo, a retired model), not an outage. The client hears
    of the name it asked for; the upstream's own words, with its model id, go to the
    log (and the ledger, with the attempt)."""
    log.warning("upstream %s does not serve %r (model %s, asked for as %s): %s",
                target.upstream, target.upstream_model, target.name, ctx.requested_model, exc.message)
    return ModelNotFound(f"The model `{ctx.requested_model}` is not available: the upstream it is routed to does not serve it.",
                         param="model")


def _kind(exc: GatewayError) -> str:
    if isinstance(exc, UpstreamTimeout):
        return TIMEOUT
    if exc.upstream_status is None:
        return CONNECT if isinstance(exc, UpstreamError) else HTTP
    return classify_http_error(exc.upstream_status, exc.upstream_code, exc.message,
                               parse_provider_limits(exc.upstream_headers or {}))


def _final_error(errors: list[GatewayError]) -> GatewayError:
    if not errors:
        return UpstreamError("no upstream could be tried")
    if len(errors) == 1:
        return errors[0]
    final = AllUpstreamsFailed(errors)
    final.headers.update(errors[-1].headers)
    return final
