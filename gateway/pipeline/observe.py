"""Turn a finished request's context into Prometheus observations (bounded labels)."""

from __future__ import annotations

import time

from gateway.pipeline.context import RequestContext
from gateway.telemetry.metrics import Metrics


def status_class(status: int) -> str:
    return "ok" if status < 400 else str(status)


def record_request(m: Metrics, ctx: RequestContext) -> None:
    model = ctx.final_attempt.target.name if ctx.final_attempt else (ctx.targets[0].name if ctx.targets else "none")
    m.requests.labels(ctx.tenant or "unauthenticated", model, status_class(ctx.status)).inc()
    if ctx.cache is not None:
        m.cache.labels(ctx.tenant, ctx.cache.status).inc()
    tl = ctx.timeline
    end = tl.end or time.monotonic()
    m.e2e.labels(model).observe(end - tl.enqueue)
    if tl.first_token is not None:
        m.ttft.labels(model).observe(tl.first_token - tl.enqueue)
    for attempt in ctx.attempts:
        a_tl = attempt.timeline
        m.attempts.labels(attempt.target.upstream, attempt.target.name, attempt.status).inc()
        if a_tl.upstream_start is not None and a_tl.end is not None:
            m.upstream_latency.labels(attempt.target.upstream).observe(a_tl.end - a_tl.upstream_start)
        usage = attempt.usage
        if usage is None:
            continue
        m.tokens.labels(ctx.tenant, attempt.target.name, "input").inc(usage.prompt_tokens)
        m.tokens.labels(ctx.tenant, attempt.target.name, "cached").inc(usage.cached_tokens)
        m.tokens.labels(ctx.tenant, attempt.target.name, "output").inc(usage.completion_tokens)
        if ctx.prompt.counted:  # only requests whose prompt was counted say how good the count is
            m.estimate_error.labels(attempt.target.name).observe(usage.prompt_tokens / ctx.prompt.counted)
        if usage.completion_tokens > 1 and a_tl.first_token is not None and a_tl.last_token is not None:
            m.tpot.labels(attempt.target.name).observe((a_tl.last_token - a_tl.first_token) / (usage.completion_tokens - 1))
