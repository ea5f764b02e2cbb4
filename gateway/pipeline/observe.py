"""Turn a finished request's context into Prometheus observations (bounded labels)."""

from __future__ import annotations

import time

from gateway.pipeline.context import RequestContext
from gateway.telemetry.metrics import Metrics


def status_class(status: int) -> str:
    return "ok" if status < 400 else str(status)


def record_request(m: Metrics, ctx: RequestContext) -> None:
    model = ctx.final_attempt.target.name if ctx.final_attempt else (ctx.targets[0].name if ctx.targets else "none")
    m.of(m.requests, ctx.tenant or "unauthenticated", model, status_class(ctx.status)).inc()
    if ctx.cache is not None:
        m.of(m.cache, ctx.tenant, ctx.cache.status).inc()
    tl = ctx.timeline
    end = tl.end or time.monotonic()
    m.of(m.e2e, model).observe(end - tl.enqueue)
    if tl.first_token is not None:
        m.of(m.ttft, model).observe(tl.first_token - tl.enqueue)
    for attempt in ctx.attempts:
        a_tl = attempt.timeline
        m.of(m.attempts, attempt.target.upstream, attempt.target.name, attempt.status).inc()
        if a_tl.upstream_start is not None and a_tl.end is not None:
            m.of(m.upstream_latency, attempt.target.upstream).observe(a_tl.end - a_tl.upstream_start)
        usage = attempt.usage
        if usage is None:
            continue
        m.of(m.tokens, ctx.tenant, attempt.target.name, "input").inc(usage.prompt_tokens)
        m.of(m.tokens, ctx.tenant, attempt.target.name, "cached").inc(usage.cached_tokens)
        m.of(m.tokens, ctx.tenant, attempt.target.name, "output").inc(usage.completion_tokens)
        if ctx.prompt.counted:  # only requests whose prompt was counted say how good the count is
            m.of(m.estimate_error, attempt.target.name).observe(usage.prompt_tokens / ctx.prompt.counted)
        if usage.completion_tokens > 1 and a_tl.first_token is not None and a_tl.last_token is not None:
            m.of(m.tpot, attempt.target.name).observe((a_tl.last_token - a_tl.first_token) / (usage.completion_tokens - 1))
