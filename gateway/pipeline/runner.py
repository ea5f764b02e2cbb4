"""The request path, in one ordered place. Handlers call `Pipeline.run`; stages read
and write the RequestContext; this module is the only one that knows their order."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from gateway.accounting.hold_and_settle import Accounting
from gateway.accounting.money import usd
from gateway.admission.gate import AdmissionGate
from gateway.auth.keys import KeyOwner
from gateway.caching.breakpoints import add_chat_breakpoint
from gateway.caching.replay import completion_from_stream, stream_from_completion
from gateway.caching.response_cache import BYPASS, HIT, ResponseCache, cache_scope
from gateway.caching.salts import TenantSalts
from gateway.caching.steering import steer
from gateway.caching.volatility import PrefixHygiene, VolatilityDetector
from gateway.errors import AuthenticationFailed, GatewayError, InvalidRequest
from gateway.pipeline import forward, messages
from gateway.pipeline.escalation import checks_for, run_chain
from gateway.pipeline.parse import check_body, output_bound, parse_json_object, response_format_kind
from gateway.pipeline.reservation import Reservation
from gateway.pipeline.retry import Retrier
from gateway.request_context import Attempt, RequestContext
from gateway.routing.policy import Route
from gateway.routing.prefix_blocks import prompt_text
from gateway.routing.reload import PolicyHolder
from gateway.routing.resolved import ModelTarget, RouteRequest, RuntimePolicy
from gateway.telemetry.ids import IdSource
from gateway.telemetry.metrics import Metrics
from gateway.tokens.counting import Tokenizers
from gateway.tokens.prompt_size import PromptSize
from gateway.upstreams.base import PoolRequest, Upstream, UpstreamSource, UpstreamStream
from gateway.upstreams.translate import error_from_reply
from gateway.verify.signals import Verifier

log = logging.getLogger("gateway.request")
T = TypeVar("T")

UPSTREAM_PATHS = {"chat.completions": "/chat/completions", "completions": "/completions", "embeddings": "/embeddings",
                  messages.MESSAGES: "/messages", messages.COUNT_TOKENS: "/messages/count_tokens"}


@dataclass(slots=True)
class JsonReply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class StreamReply:
    chunks: AsyncIterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PipelineParts:
    """Everything the stages use, built once in the app's lifespan."""

    policies: PolicyHolder
    upstreams: UpstreamSource
    metrics: Metrics
    salts: TenantSalts
    accounting: Accounting
    retrier: Retrier
    admission: AdmissionGate
    cache: ResponseCache
    hygiene: PrefixHygiene
    volatility: VolatilityDetector
    verifier: Verifier
    ids: IdSource
    tokenizers: Tokenizers = field(default_factory=Tokenizers)


class Pipeline:
    def __init__(self, parts: PipelineParts) -> None:
        self.parts = parts
        self.policies = parts.policies
        self.accounting = parts.accounting
        # Client requests on the model endpoints that have arrived and not yet been answered
        # to the end (a stream counts until its last event), kept by api/hot_paths.py.
        self.serving = 0

    async def run(self, endpoint: str, raw_body: bytes, headers: Mapping[str, str]) -> JsonReply | StreamReply:
        # One policy for the whole request, even if a reload swaps it meanwhile.
        ctx = RequestContext(request_id=self.parts.ids.next(), endpoint=endpoint, path=UPSTREAM_PATHS[endpoint],
                             policy=self.policies.current)
        p = self.parts
        try:
            # Whatever happens inside - an answer, a refusal, an upstream failure, a bug,
            # the client leaving - the request ends on the way out (pipeline/reservation.py).
            async with Reservation(ctx, self.accounting, p.admission, p.metrics, p.tokenizers) as reservation:
                reply = await self.stages(ctx, raw_body, headers, reservation)
        except GatewayError as exc:
            exc.headers.setdefault("x-request-id", ctx.request_id)
            if ctx.attempts:
                exc.headers["x-gateway-cost-usd"] = usd(ctx.cost_pico)
            raise
        if reservation.ended and ctx.attempts:  # what it cost is known once it has ended
            reply.headers["x-gateway-cost-usd"] = usd(ctx.cost_pico)
            if ctx.task_id is not None and isinstance(reply, JsonReply):
                await self.add_task_spent(ctx.task_id, reply.headers)
        return reply

    # -- stages, in order -------------------------------------------------------------

    async def stages(self, ctx: RequestContext, raw_body: bytes, headers: Mapping[str, str],
                     reservation: Reservation) -> JsonReply | StreamReply:
        self.authenticate(ctx, headers, ctx.policy)
        await self.parse_and_estimate(ctx, raw_body, headers)
        if ctx.endpoint == messages.COUNT_TOKENS:
            return await self.count_tokens(ctx)
        task = await self.accounting.task_for(ctx)
        # A cached answer spends nothing upstream, so it needs neither capacity nor a hold.
        cached = await self.serve_from_cache(ctx, headers.get("cache-control", ""))
        if cached is not None:
            return cached
        ctx.admitted = await self.parts.admission.admit(ctx, ctx.policy, headers.get("x-priority"))
        await reservation.hold(task)
        route = self.checked_route(ctx)
        if route is not None:
            return await self.call_route(ctx, route, headers)
        if ctx.stream:
            return await self.call_streaming(ctx, reservation.ended_by_relay())
        return await self.call(ctx)

    def authenticate(self, ctx: RequestContext, headers: Mapping[str, str], policy: RuntimePolicy) -> None:
        owner = self.identify(headers, policy, x_api_key=ctx.endpoint in messages.ENDPOINTS)
        ctx.tenant, ctx.key_id = owner.tenant, owner.key_id

    def identify(self, headers: Mapping[str, str], policy: RuntimePolicy | None = None, *, x_api_key: bool = False) -> KeyOwner:
        """`x_api_key`: the key may come in `x-api-key` too, as Anthropic's clients send it."""
        auth = headers.get("authorization", "")
        scheme, _, key = auth.partition(" ")
        if x_api_key and not auth:
            scheme, key = "bearer", headers.get("x-api-key", "")
        if scheme.lower() != "bearer" or not key.strip():
            how = "`x-api-key: <key>` or " if x_api_key else ""
            raise AuthenticationFailed(f"Missing API key: send {how}`Authorization: Bearer <key>`")
        owner = (policy or self.policies.current).keys.lookup(key.strip())
        if owner is None:
            raise AuthenticationFailed("Incorrect API key provided")
        return owner

    async def parse_and_estimate(self, ctx: RequestContext, raw_body: bytes, headers: Mapping[str, str]) -> None:
        # The body's size limit is enforced while it is read (api/hot_paths), not again here.
        policy = ctx.policy
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
        named = policy.targets.get(ctx.requested_model)
        ctx.prompt = PromptSize(ctx.endpoint, body, named.tokenizer if named else policy.policy.defaults.tokenizer, self.parts.tokenizers)
        if ctx.endpoint == "chat.completions":  # statistics only: off the request's path (deferred_work.py)
            chat = body["messages"]
            self.accounting.deferred.add(lambda: self.watch_prefix(ctx, chat))
        ctx.route, ctx.targets = policy.candidates(
            ctx.requested_model,
            RouteRequest(
                tenant=ctx.tenant,
                task_class=ctx.task_class,
                has_tools=bool(body.get("tools")),
                response_format=response_format_kind(body),
                prompt_tokens=await ctx.prompt.count() if policy.routes_on_prompt_size(ctx.requested_model) else ctx.prompt.bound,
            ),
        )
        if ctx.endpoint in messages.ENDPOINTS:
            ctx.upstream_headers = messages.passed_headers(headers)
        ctx.max_output_tokens = output_bound(ctx.endpoint, body, ctx.targets[0].max_output_tokens)

    def watch_prefix(self, ctx: RequestContext, messages: list[Any]) -> None:
        """Volatile text early in a prompt (a timestamp in the system prompt) defeats
        prefix caching; count it per tenant so the waste is visible."""
        span = self.parts.volatility.first_volatile(messages)
        self.parts.hygiene.observe(ctx.tenant, span)
        if span is not None:
            self.parts.metrics.volatile_prefix.labels(ctx.tenant, span.kind).inc()

    async def serve_from_cache(self, ctx: RequestContext, cache_control: str) -> JsonReply | StreamReply | None:
        if ctx.endpoint in messages.ENDPOINTS:
            return None  # Anthropic's own prompt caching applies; replays are for OpenAI's shapes
        cache = self.parts.cache
        ctx.cache = cache.plan(ctx.endpoint, ctx.tenant, ctx.targets[0], ctx.body, ctx.policy, cache_control)
        answer = await cache.lookup(ctx.cache)
        if answer is None:
            return None
        ctx.cache.status = HIT
        ctx.cache_answer = answer
        headers = {**self.response_headers(ctx), "x-gateway-model": answer.model, "x-gateway-upstream": answer.upstream,
                   "x-gateway-cost-usd": usd(0)}
        if not ctx.stream:
            return JsonReply(200, answer.body, headers)
        events = stream_from_completion(orjson.loads(answer.body), include_usage=ctx.client_wants_usage)
        return StreamReply(_replay(events), headers)

    def prepare_upstream_body(self, ctx: RequestContext, target: ModelTarget) -> bytes:
        """Patch only what must change; every other client field passes through."""
        policy = ctx.policy
        breakpoint_wanted = policy.policy.models[target.name].auto_cache_control and ctx.endpoint != messages.COUNT_TOKENS
        if ctx.endpoint in messages.ENDPOINTS:
            if messages.speaks_messages(target):
                return messages.native_body(ctx.body, target, breakpoint_wanted)
            body = messages.chat_body(ctx.body, target)  # then prepared as any chat call
        else:
            body = dict(ctx.body)
        body["model"] = target.upstream_model
        if ctx.endpoint != "embeddings" and not (body.get("max_completion_tokens") or body.get("max_tokens")):
            # Send the bound we reserve for, so the worst case really is the worst case.
            body["max_tokens" if ctx.endpoint == "completions" else "max_completion_tokens"] = target.max_output_tokens
        if ctx.stream and not ctx.buffered:
            options = body.get("stream_options")
            body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        elif ctx.buffered:  # the gateway checks the whole answer, then replays it as a stream
            body.pop("stream", None)
            body.pop("stream_options", None)
        steer(body, target.upstream_kind, cache_scope(policy, ctx.tenant), self.parts.salts,
              policy.policy.upstreams[target.upstream].prompt_cache_key)
        if breakpoint_wanted and target.upstream_kind == messages.NATIVE_KIND:
            add_chat_breakpoint(body)
        return orjson.dumps(body)

    def failover_targets(self, policy: RuntimePolicy, first: ModelTarget) -> list[ModelTarget]:
        return [first, *(policy.targets[name] for name in policy.policy.models[first.name].fallbacks)]

    def pool_request(self, ctx: RequestContext, target: ModelTarget, can_spill: bool) -> PoolRequest | None:
        """What a vLLM pool places the request by: its prompt, the tenant's salt (as
        `steer` sends it), its deadline, and whether a fallback can take it instead."""
        if target.upstream_kind != "vllm":
            return None
        salt = self.parts.salts.cache_salt(cache_scope(ctx.policy, ctx.tenant))
        return PoolRequest(ctx.tenant, prompt_text(ctx.endpoint, ctx.body), salt, ctx.deadline, can_spill)

    async def attempt(self, ctx: RequestContext,
                      send: Callable[[ModelTarget, bytes, PoolRequest | None], Awaitable[tuple[Attempt, T]]],
                      first: ModelTarget | None = None) -> tuple[Attempt, T]:
        """Every upstream attempt goes through the retry module; attempts after the
        first are covered by a budget hold first (a pricier fallback, or a retry
        after an attempt that may have been billed, needs more held)."""
        policy = ctx.policy
        targets = self.failover_targets(policy, first or ctx.targets[0])

        async def held(target: ModelTarget) -> tuple[Attempt, T]:
            if ctx.attempts:
                await self.accounting.hold_for(ctx, policy, target)
            self.accounting.deferred.soon()  # earlier answers' books, while this one is on the wire
            await self.parts.admission.pace_upstream(ctx, policy, target)
            pool = self.pool_request(ctx, target, can_spill=target is not targets[-1])
            return await send(target, self.prepare_upstream_body(ctx, target), pool)

        return await self.parts.retrier.call(ctx, targets, policy.policy.defaults.retry, held)

    def upstream_for(self, ctx: RequestContext, target: ModelTarget) -> Upstream:
        upstream = self.parts.upstreams.get(target.upstream)
        if ctx.endpoint in messages.ENDPOINTS:
            return messages.upstream_for(upstream, target, ctx.upstream_headers)
        return upstream.with_headers(ctx.upstream_headers) if ctx.upstream_headers else upstream

    async def count_tokens(self, ctx: RequestContext) -> JsonReply:
        """Anthropic's token count, asked of the model's upstream: nothing is generated
        and nothing billed, so no admission, hold or booking - auth and the model's
        access apply as for a call."""
        target = ctx.targets[0]
        headers = {"x-request-id": ctx.request_id, "x-gateway-model": target.name, "x-gateway-upstream": target.upstream}
        if not messages.speaks_messages(target):  # no count to ask for: the gateway's own tokenizer counts
            counted = await ctx.prompt.count()
            return JsonReply(200, orjson.dumps({"input_tokens": counted}), headers)
        upstream = self.upstream_for(ctx, target)
        reply = await upstream.send(ctx.path, self.prepare_upstream_body(ctx, target), forward.remaining_s(ctx))
        if reply.status != 200:
            raise error_from_reply(upstream.name, reply.status, reply.headers, reply.body, upstream.secrets)
        return JsonReply(200, reply.body, headers)

    async def call(self, ctx: RequestContext) -> JsonReply:
        async def send(target: ModelTarget, payload: bytes, pool: PoolRequest | None) -> tuple[Attempt, forward.Answer]:
            return await forward.send_once(ctx, self.upstream_for(ctx, target), target, payload, pool)

        _, (body, raw) = await self.attempt(ctx, send)
        await self.remember(ctx, body, raw)
        return JsonReply(200, raw, self.response_headers(ctx))

    async def add_task_spent(self, task_id: str, headers: dict[str, str]) -> None:
        task = await self.accounting.tasks.get(task_id)
        if task is not None:
            headers["x-gateway-task-spent-usd"] = usd(await self.accounting.tasks.spent_pico(task))

    def checked_route(self, ctx: RequestContext) -> Route | None:
        """The route, when this request's answer is to be checked before it is returned."""
        route = ctx.policy.policy.routes.get(ctx.route) if ctx.route else None
        if route is None or not route.escalate_when or ctx.endpoint != "chat.completions":
            return None
        return route if not ctx.stream or route.streaming == "buffer" else None

    async def call_route(self, ctx: RequestContext, route: Route, headers: Mapping[str, str]) -> JsonReply | StreamReply:
        """A route with checks: verify each answer, escalate on failure, answer with the
        first that passes (or the best the budget allowed)."""
        ctx.buffered = ctx.stream

        async def attempt_on(target: ModelTarget) -> forward.Answer:
            async def send(t: ModelTarget, payload: bytes, pool: PoolRequest | None) -> tuple[Attempt, forward.Answer]:
                return await forward.send_once(ctx, self.parts.upstreams.get(t.upstream), t, payload, pool)

            return (await self.attempt(ctx, send, first=target))[1]

        result = await run_chain(ctx, ctx.targets, checks_for(route), self.parts.verifier, headers, attempt_on)
        for reason in result.reasons:
            for signal in reason.split(", "):
                self.parts.metrics.escalations.labels(ctx.route or "", signal).inc()
        out = self.response_headers(ctx)
        out["x-gateway-escalations"] = str(len(result.reasons))
        if result.stopped:
            out["x-gateway-escalation-stopped"] = result.stopped
        if not ctx.stream:
            return JsonReply(200, result.raw, out)
        return StreamReply(_replay(stream_from_completion(result.body, include_usage=ctx.client_wants_usage)), out)

    async def call_streaming(self, ctx: RequestContext, end: Callable[[int], Awaitable[None]]) -> StreamReply:
        """`end`: ends the request (pipeline/reservation.py), once the relay is over."""

        async def send(target: ModelTarget, payload: bytes, pool: PoolRequest | None) -> tuple[Attempt, UpstreamStream]:
            return await forward.open_stream(ctx, self.upstream_for(ctx, target), target, payload, pool)

        attempt, stream = await self.attempt(ctx, send)
        secrets = self.parts.upstreams.get(attempt.target.upstream).secrets
        # Keep what was relayed (bounded) so a complete answer can be cached once it ends.
        relayed: bytearray | None = bytearray() if ctx.cache is not None and ctx.cache.store else None

        async def done(_: RequestContext) -> None:
            await end(200 if attempt.status == "ok" else 502)

        async def cache_complete_answer() -> None:
            body = completion_from_stream(bytes(relayed or b"").split(b"\n\n"))
            if body is not None:
                if attempt.usage is not None and body.get("usage") is None:
                    body["usage"] = attempt.usage.as_openai()
                await self.remember(ctx, body, orjson.dumps(body))

        relay = forward.relay_stream(ctx, attempt, stream, done, relayed, cache_complete_answer if relayed is not None else None,
                                     only_call_in_flight=lambda: self.serving <= 1, secrets=secrets)
        return StreamReply(relay, self.response_headers(ctx))

    async def remember(self, ctx: RequestContext, body: dict[str, Any], raw: bytes) -> None:
        """Cache the answer under the model the request was planned for - only if that
        model answered (a fallback's answer is not the planned model's)."""
        attempt = ctx.final_attempt
        if ctx.cache is None or not ctx.cache.store or attempt is None or attempt.target is not ctx.targets[0]:
            return
        try:
            await self.parts.cache.save(ctx.cache, attempt.target, body, raw)
        except Exception:  # a cache that is down costs hits, never answers
            log.warning("could not store a response in the cache", exc_info=True)

    def response_headers(self, ctx: RequestContext) -> dict[str, str]:
        attempt = ctx.final_attempt
        headers = {**ctx.response_headers, "x-request-id": ctx.request_id}
        if attempt is not None:
            headers["x-gateway-model"] = attempt.target.name
            headers["x-gateway-upstream"] = attempt.target.upstream
        if ctx.route:
            headers["x-gateway-route"] = ctx.route
        headers["x-gateway-cache"] = ctx.cache.status if ctx.cache is not None else BYPASS
        return headers


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


async def _replay(events: list[bytes]) -> AsyncIterator[bytes]:
    """A stored answer's events, all in hand: they go to the client in one write, not
    one each (the client reads the same events, split as a live stream splits them)."""
    yield b"".join(events)
