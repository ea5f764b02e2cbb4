"""The request path, in one ordered place. Handlers call `Pipeline.run`; stages read
and write the RequestContext; this module is the only one that knows their order."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import orjson

from gateway.accounting.books import Accounting
from gateway.accounting.money import usd
from gateway.admission.gate import AdmissionGate
from gateway.auth.keys import KeyOwner
from gateway.caching.salts import TenantSalts
from gateway.errors import AuthenticationFailed, BodyTooLarge, GatewayError, InvalidRequest
from gateway.pipeline import forward
from gateway.pipeline.context import Attempt, RequestContext
from gateway.pipeline.parse import check_body, estimate_prompt_tokens, output_bound, parse_json_object, response_format_kind
from gateway.pipeline.retry import Retrier
from gateway.routing.reload import PolicyHolder
from gateway.routing.resolved import ModelTarget, RouteRequest
from gateway.telemetry.metrics import Metrics
from gateway.upstreams.base import UpstreamStream
from gateway.upstreams.registry import UpstreamRegistry

log = logging.getLogger("gateway.request")
T = TypeVar("T")

UPSTREAM_PATHS = {"chat.completions": "/chat/completions", "completions": "/completions", "embeddings": "/embeddings"}
VLLM_ONLY_FIELDS = ("cache_salt",)


@dataclass(slots=True)
class JsonReply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class StreamReply:
    chunks: AsyncIterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


class Pipeline:
    def __init__(self, policies: PolicyHolder, upstreams: UpstreamRegistry, metrics: Metrics, salts: TenantSalts,
                 accounting: Accounting, retrier: Retrier, admission: AdmissionGate) -> None:
        self.accounting = accounting
        self.admission = admission
        self.retrier = retrier
        self.policies = policies
        self.upstreams = upstreams
        self.metrics = metrics
        self.salts = salts

    async def run(self, endpoint: str, raw_body: bytes, headers: Mapping[str, str]) -> JsonReply | StreamReply:
        ctx = RequestContext(request_id=new_request_id(), endpoint=endpoint, path=UPSTREAM_PATHS[endpoint])
        try:
            self.authenticate(ctx, headers)
            self.parse_and_estimate(ctx, raw_body, headers)
            task = await self.accounting.task_for(ctx)
            ctx.admitted = await self.admission.admit(ctx, self.policies.current, headers.get("x-priority"))
            await self.accounting.reserve(ctx, self.policies.current, task)
            # the response cache slots in here
            if ctx.stream:
                return await self.call_streaming(ctx)
            return await self.call(ctx)
        except BaseException as exc:
            # Whatever went wrong - a refusal, an upstream failure, a bug, the client
            # leaving - the attempts made so far are booked and the hold is ended.
            status = exc.http_status if isinstance(exc, GatewayError) else 499 if isinstance(exc, asyncio.CancelledError) else 500
            with anyio.CancelScope(shield=True):
                await self.finish(ctx, status)
            if isinstance(exc, GatewayError):
                exc.headers.setdefault("x-request-id", ctx.request_id)
                if ctx.attempts:
                    exc.headers["x-gateway-cost-usd"] = usd(ctx.cost_pico)
            raise

    # -- stages, in order -------------------------------------------------------------

    def authenticate(self, ctx: RequestContext, headers: Mapping[str, str]) -> None:
        owner = self.identify(headers)
        ctx.tenant, ctx.key_id = owner.tenant, owner.key_id

    def identify(self, headers: Mapping[str, str]) -> KeyOwner:
        auth = headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise AuthenticationFailed("Missing API key: send `Authorization: Bearer <key>`")
        owner = self.policies.current.keys.lookup(key.strip())
        if owner is None:
            raise AuthenticationFailed("Incorrect API key provided")
        return owner

    def parse_and_estimate(self, ctx: RequestContext, raw_body: bytes, headers: Mapping[str, str]) -> None:
        policy = self.policies.current
        limit = policy.policy.defaults.max_body_bytes
        if len(raw_body) > limit:
            raise BodyTooLarge(f"the request body is {len(raw_body)} bytes; the limit is {limit}")
        body = parse_json_object(raw_body)
        check_body(ctx.endpoint, body)
        ctx.body = body
        ctx.requested_model = body["model"]
        ctx.stream = bool(body.get("stream")) and ctx.endpoint != "embeddings"
        options = body.get("stream_options")
        ctx.client_wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        ctx.task_id = headers.get("x-task-id") or None
        ctx.task_class = headers.get("x-task-class") or None
        ctx.deadline = ctx.timeline.enqueue + _timeout_s(headers, policy.policy.defaults.request_timeout_s)
        first_tokenizer = policy.targets[next(iter(policy.targets))].tokenizer if policy.targets else "o200k_base"
        if ctx.requested_model in policy.targets:
            first_tokenizer = policy.targets[ctx.requested_model].tokenizer
        ctx.prompt_tokens_estimate = estimate_prompt_tokens(ctx.endpoint, body, first_tokenizer)
        ctx.route, ctx.targets = policy.candidates(
            ctx.requested_model,
            RouteRequest(
                tenant=ctx.tenant,
                task_class=ctx.task_class,
                has_tools=bool(body.get("tools")),
                response_format=response_format_kind(body),
                prompt_tokens=ctx.prompt_tokens_estimate,
            ),
        )
        ctx.max_output_tokens = output_bound(ctx.endpoint, body, ctx.targets[0].max_output_tokens)

    def prepare_upstream_body(self, ctx: RequestContext, target: ModelTarget) -> bytes:
        """Patch only what must change; every other client field passes through."""
        body = dict(ctx.body)
        body["model"] = target.upstream_model
        if ctx.endpoint != "embeddings" and not (body.get("max_completion_tokens") or body.get("max_tokens")):
            # Send the bound we reserve for, so the worst case really is the worst case.
            body["max_tokens" if ctx.endpoint == "completions" else "max_completion_tokens"] = target.max_output_tokens
        if ctx.stream:
            options = body.get("stream_options")
            body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        if target.upstream_kind == "vllm":
            body["cache_salt"] = self.salts.cache_salt(ctx.tenant)
        else:
            for name in VLLM_ONLY_FIELDS:
                body.pop(name, None)
        return orjson.dumps(body)

    def failover_targets(self, ctx: RequestContext) -> list[ModelTarget]:
        policy = self.policies.current
        first = ctx.targets[0]
        return [first, *(policy.targets[name] for name in policy.policy.models[first.name].fallbacks)]

    async def attempt(self, ctx: RequestContext, send: Callable[[ModelTarget, bytes], Awaitable[T]]) -> T:
        """Every upstream attempt goes through the retry module; attempts after the
        first are covered by a budget hold first (a pricier fallback, or a retry
        after an attempt that may have been billed, needs more held)."""
        policy = self.policies.current

        async def covered(target: ModelTarget) -> T:
            if ctx.attempts:
                await self.accounting.cover(ctx, policy, target)
            await self.admission.pace_upstream(ctx, policy, target)
            return await send(target, self.prepare_upstream_body(ctx, target))

        return await self.retrier.call(ctx, self.failover_targets(ctx), policy.policy.defaults.retry, covered)

    async def call(self, ctx: RequestContext) -> JsonReply:
        async def send(target: ModelTarget, payload: bytes) -> bytes:
            _, raw = await forward.send_once(ctx, self.upstreams.get(target.upstream), target, payload)
            return raw

        raw = await self.attempt(ctx, send)
        await self.finish(ctx, 200)
        headers = self.response_headers(ctx)
        headers["x-gateway-cost-usd"] = usd(ctx.cost_pico)
        if ctx.task_id is not None:
            task = await self.accounting.tasks.get(ctx.task_id)
            if task is not None:
                headers["x-gateway-task-spent-usd"] = usd(await self.accounting.tasks.spent_pico(task))
        return JsonReply(200, raw, headers)

    async def call_streaming(self, ctx: RequestContext) -> StreamReply:
        async def send(target: ModelTarget, payload: bytes) -> tuple[Attempt, UpstreamStream]:
            return await forward.open_stream(ctx, self.upstreams.get(target.upstream), target, payload)

        attempt, stream = await self.attempt(ctx, send)

        async def done(c: RequestContext) -> None:
            await self.finish(c, 200 if attempt.status == "ok" else 502)

        return StreamReply(forward.relay_stream(ctx, attempt, stream, done), self.response_headers(ctx))

    async def finish(self, ctx: RequestContext, status: int) -> None:
        """Settle and record; runs exactly once per request, success or not."""
        if ctx.finished:
            return
        ctx.finished = True
        ctx.status = status
        ctx.timeline.mark("end")
        try:
            if ctx.attempts:
                settlement = await self.accounting.settle(ctx)
                ctx.cost_pico = settlement.cost_pico
            await self.admission.settle(ctx, ctx.admitted)
        finally:
            self.record_metrics(ctx)

    def response_headers(self, ctx: RequestContext) -> dict[str, str]:
        attempt = ctx.final_attempt
        headers = {**ctx.response_headers, "x-request-id": ctx.request_id}
        if attempt is not None:
            headers["x-gateway-model"] = attempt.target.name
            headers["x-gateway-upstream"] = attempt.target.upstream
        if ctx.route:
            headers["x-gateway-route"] = ctx.route
        return headers

    # -- telemetry --------------------------------------------------------------------

    def record_metrics(self, ctx: RequestContext) -> None:
        m = self.metrics
        model = ctx.final_attempt.target.name if ctx.final_attempt else "none"
        m.requests.labels(ctx.tenant or "unauthenticated", model, _status_class(ctx.status)).inc()
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
            if ctx.prompt_tokens_estimate:
                m.estimate_error.labels(attempt.target.name).observe(usage.prompt_tokens / ctx.prompt_tokens_estimate)
            if usage.completion_tokens > 1 and a_tl.first_token is not None and a_tl.last_token is not None:
                m.tpot.labels(attempt.target.name).observe((a_tl.last_token - a_tl.first_token) / (usage.completion_tokens - 1))


def _timeout_s(headers: Mapping[str, str], default: float) -> float:
    raw = headers.get("x-request-timeout")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest("`x-request-timeout` must be a number of seconds") from None
    if not 0 < value <= 86_400:
        raise InvalidRequest("`x-request-timeout` must be between 0 and 86400 seconds")
    return value


def _status_class(status: int) -> str:
    return "ok" if status < 400 else str(status)
