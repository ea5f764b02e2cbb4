"""Turn a finished request's context into Prometheus observations (bounded labels)."""

from __future__ import annotations

import time

from gateway.request_context import RequestContext
from gateway.telemetry.metrics import Metrics


def status_class(status: int) -> str:
    return "ok" if status < 400 else str(status)


def record_request(m: Metrics, ctx: RequestContext) -> None:
    model = ctx.final_attempt.target.name if ctx.final_attempt else (ctx.targets[0].name if ctx.targets else "none")
    tenant = ctx.tenant
    m.requests.inc((tenant or "unauthenticated", model, status_class(ctx.status)))
    if ctx.cache is not None:
        m.cache.inc((tenant, ctx.cache.status))
    tl = ctx.timeline
    end = tl.end or time.monotonic()
    by_model = (model,)
    m.e2e.observe(by_model, end - tl.enqueue)
    if tl.first_token is not None:
        m.ttft.observe(by_model, tl.first_token - tl.enqueue)
    for attempt in ctx.attempts:
        a_tl, target = attempt.timeline, attempt.target
        m.attempts.inc((target.upstream, target.name, attempt.status))
        if a_tl.upstream_start is not None and a_tl.end is not None:
            m.upstream_latency.observe((target.upstream,), a_tl.end - a_tl.upstream_start)
        if attempt.cost_pico:  # booked from reported usage, or from the gateway's estimate when none came
            m.cost.inc((tenant, target.name), attempt.cost_pico)
        usage = attempt.usage
        if usage is None:
            continue
        m.tokens.inc((tenant, target.name, "input"), usage.prompt_tokens)
        m.tokens.inc((tenant, target.name, "cached"), usage.cached_tokens)
        m.tokens.inc((tenant, target.name, "output"), usage.completion_tokens)
        if ctx.prompt.counted:  # only requests whose prompt was counted say how good the count is
            m.estimate_error.observe((target.name,), usage.prompt_tokens / ctx.prompt.counted)
        if usage.completion_tokens > 1 and a_tl.first_token is not None and a_tl.last_token is not None:
            m.tpot.observe((target.name,), (a_tl.last_token - a_tl.first_token) / (usage.completion_tokens - 1))
