"""POST /v1/tools/{name}/invoke: call a tool the policy declares, through the tenant's
tool-result cache, and book the call (its time, and its price when it has one) to the
tenant and the task like any model call."""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.accounting.hold_and_settle import Accounting
from gateway.accounting.ledger import HoldRequest, expiry
from gateway.accounting.money import pico_from_usd, usd
from gateway.auth.keys import KeyOwner
from gateway.caching.response_cache import BYPASS, HIT, MISS, cache_scope
from gateway.caching.tool_cache import ToolCache
from gateway.errors import GatewayError, InvalidRequest, NotFound, UpstreamTimeout
from gateway.pipeline.parse import parse_json_object
from gateway.request_context import RequestContext
from gateway.routing.policy import Tool
from gateway.routing.reload import PolicyHolder
from gateway.types.budget import Hold
from gateway.upstreams.tools import ToolClient, ToolReply

# A GET tool's arguments travel in its URL's query, percent-encoded (up to 3 characters
# a byte): this keeps the URL within what servers take (nginx: 8 KiB lines by default,
# then 32) and far from httpx's 64 KiB limit.
MAX_GET_ARGUMENTS = 8 * 1024


class ToolRunner:
    def __init__(self, policies: PolicyHolder, client: ToolClient, cache: ToolCache, accounting: Accounting) -> None:
        self.policies = policies
        self.client = client
        self.cache = cache
        self.accounting = accounting

    async def invoke(self, owner: KeyOwner, name: str, raw_body: bytes, headers: Mapping[str, str]) -> tuple[bytes, dict[str, str]]:
        policy = self.policies.current
        tool = policy.policy.tools.get(name)
        if tool is None:
            raise NotFound(f"no tool `{name}` is declared in the policy")
        body = parse_json_object(raw_body or b"{}")
        unknown = set(body) - {"arguments"}
        if unknown:
            raise InvalidRequest(f"unknown fields {sorted(unknown)}: send {{\"arguments\": {{...}}}}", param=min(unknown))
        arguments = body.get("arguments")
        if arguments is None:
            arguments = {}
        elif not isinstance(arguments, dict):
            raise InvalidRequest("`arguments` must be a JSON object of the tool's arguments", param="arguments")
        if tool.method == "GET" and len(encoded := orjson.dumps(arguments)) > MAX_GET_ARGUMENTS:
            raise InvalidRequest(f"`arguments` are {len(encoded)} bytes of JSON; tool `{name}` is called with GET, which "
                                 f"carries them in the URL, so they may be at most {MAX_GET_ARGUMENTS}", param="arguments")
        ctx = RequestContext(request_id="req_" + secrets.token_hex(12), endpoint="tool", path="", policy=policy)
        ctx.tenant, ctx.key_id, ctx.task_id = owner.tenant, owner.key_id, headers.get("x-task-id") or None
        ctx.deadline = ctx.timeline.enqueue + tool.timeout_s
        task = await self.accounting.task_for(ctx)
        directives = {d.strip().lower() for d in headers.get("cache-control", "").split(",")}
        address = self.cache.address(cache_scope(policy, owner.tenant), name, tool, arguments)
        out = {"x-request-id": ctx.request_id}

        cached = await self.cache.get(address) if tool.cacheable and "no-cache" not in directives else None
        if cached is not None:
            await self._book(ctx, name, "ok", 0, self._price(tool), None, None)
            return _result(name, tool, cached, True), {**out, "x-gateway-cache": HIT, "x-gateway-cost-usd": usd(0)}

        hold = await self._hold(ctx, name, tool, task)
        try:
            reply = await self.client.call(name, tool, arguments)
        except GatewayError as exc:
            status = "timeout" if isinstance(exc, UpstreamTimeout) else "error"
            await self._book(ctx, name, status, 0, 0, hold, exc.message)
            raise
        price = self._price(tool)
        await self._book(ctx, name, "ok", price, 0, hold, None, reply)
        stored = tool.cacheable and "no-store" not in directives and tool.ttl_s > 0
        if stored:
            await self.cache.put(address, reply.body, tool.ttl_s)
        status = MISS if tool.cacheable else BYPASS
        return _result(name, tool, reply.body, False), {**out, "x-gateway-cache": status, "x-gateway-cost-usd": usd(price)}

    @staticmethod
    def _price(tool: Tool) -> int:
        return pico_from_usd(tool.price_usd) if tool.price_usd is not None else 0

    async def _hold(self, ctx: RequestContext, name: str, tool: Tool, task: Any) -> Hold | None:
        """A priced tool call holds its price against the budgets, like a model call."""
        price = self._price(tool)
        now = datetime.now(UTC)
        claims = self.accounting.claims(ctx, ctx.policy, task, now)
        if not price or not claims:
            return None
        request = HoldRequest(
            request_id=ctx.request_id, tenant=ctx.tenant, key_id=ctx.key_id, task_id=ctx.task_id, model=f"tool:{name}",
            upstream_model=name, upstream="tool", endpoint="tool", amount_pico=price, tokens=0, prompt_tokens_est=0, now=now,
            expires_at=expiry(tool.timeout_s, now, ctx.policy.policy.defaults.reservation_grace_s))
        return await self.accounting.ledger.reserve(request, claims)

    async def _book(self, ctx: RequestContext, name: str, status: str, cost: int, saved: int, hold: Hold | None,
                    error: str | None, reply: ToolReply | None = None) -> None:
        now = datetime.now(UTC)
        ctx.timeline.end = time.monotonic()
        timeline = ctx.timeline.as_offsets_ms()
        if reply is not None:
            timeline["tool_seconds"] = round(reply.seconds, 6)
        event = {
            "request_id": ctx.request_id, "attempt": 1, "reservation_id": hold.id if hold else None, "tenant": ctx.tenant,
            "key_id": ctx.key_id, "task_id": ctx.task_id, "kind": "tool", "endpoint": "tool", "model": f"tool:{name}",
            "upstream_model": name, "upstream": "tool", "route": None, "status": status, "http_status": None, "error": error,
            "usage_known": True, "prompt_tokens_est": 0, "prompt_tokens": 0, "cached_tokens": 0, "cache_write_tokens": 0,
            "completion_tokens": 0, "reasoning_tokens": 0, "cost_pico": cost, "saved_pico": saved,
            "price_source": "policy tool price" if cost or saved else None, "created_at": now, "day": now.date().isoformat(),
            "timeline": orjson.dumps(timeline).decode(),
        }
        await self.accounting.settle_or_spool(ctx.request_id, [hold] if hold else [], cost, 0, [event], now)


def _result(name: str, tool: Tool, body: bytes, cached: bool) -> bytes:
    """The tool's answer as JSON in the result, or as text when it is not JSON (or JSON
    nested too deep to be written again inside the result)."""
    try:
        result: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        result = body.decode("utf-8", errors="replace")
    envelope = {"object": "tool.result", "tool": name, "version": tool.version, "cached": cached, "result": result}
    try:
        return orjson.dumps(envelope)
    except orjson.JSONEncodeError:
        envelope["result"] = body.decode("utf-8", errors="replace")
        return orjson.dumps(envelope)
