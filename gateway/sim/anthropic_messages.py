"""The Anthropic simulator's `POST /v1/messages` and `/v1/messages/count_tokens`.

The gates come in Anthropic's order: the API key, the `anthropic-version` header, the
body and model, validation, rate limits, injected trouble (429, 529), then the answer,
non-streamed or as Anthropic's exact event sequence, billed to the usage report."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.sim.anthropic_cache import CacheUsage, prompt_blocks, total_tokens
from gateway.sim.anthropic_plan import MessagePlan, plan_message, validate
from gateway.sim.anthropic_state import AnthropicState, MessagesUsage, api_key_id, valid_version
from gateway.sim.asgi import (
    JSON_TYPE,
    DisconnectWatch,
    HttpRequest,
    Receive,
    Send,
    end_body,
    send_bytes,
    send_sse_chunk,
    start_sse,
)
from gateway.sim.generation import SimRequestError
from gateway.sim.ratelimit import retry_after_headers
from gateway.sim.textgen import seeded_rng

ENCODING = "o200k_base"


def error_body(kind: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    if request_id is not None:
        body["request_id"] = request_id
    return body


@dataclass
class Call:
    body: dict[str, Any]
    model: str
    key_id: str
    request_id: str
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


async def reply(state: AnthropicState, send: Send, status: int, payload: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    state.stats.count_status(status)
    await send_bytes(send, status, orjson.dumps(payload), [JSON_TYPE, *headers])


async def _admit(state: AnthropicState, request: HttpRequest, send: Send) -> Call | None:
    stats = state.stats
    stats.requests += 1
    stats.last_headers = request.headers
    request_id = state.new_id("req_", 12)
    ids = [(b"request-id", request_id.encode())]
    # The API takes the key in x-api-key or as a bearer token (the SDK sends the latter).
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    key = request.headers.get("x-api-key", "").strip() or (token.strip() if scheme.lower() == "bearer" else "")
    stats.last_authorization = key or None
    if not key:
        await reply(state, send, 401, error_body("authentication_error", "x-api-key header is required", request_id), ids)
        return None
    keys = state.config.api_keys
    if keys is not None and key not in keys:
        await reply(state, send, 401, error_body("authentication_error", "invalid x-api-key", request_id), ids)
        return None
    version = request.headers.get("anthropic-version")
    stats.last_version, stats.last_beta = version, request.headers.get("anthropic-beta")
    if not version:
        await reply(state, send, 400, error_body("invalid_request_error", "anthropic-version: header is required", request_id), ids)
        return None
    if not valid_version(version):
        message = f"anthropic-version: invalid version {version!r}"
        await reply(state, send, 400, error_body("invalid_request_error", message, request_id), ids)
        return None
    try:
        body = request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        await reply(state, send, 400, error_body("invalid_request_error", "The request body is not valid JSON.", request_id), ids)
        return None
    stats.last_body = body
    model = body.get("model")
    if not isinstance(model, str) or not model:
        await reply(state, send, 400, error_body("invalid_request_error", "model: Field required", request_id), ids)
        return None
    if model not in state.config.models:
        await reply(state, send, 404, error_body("not_found_error", f"model: {model}", request_id), ids)
        return None
    return Call(body, model, api_key_id(key), request_id, ids)


async def count_tokens(state: AnthropicState, request: HttpRequest, receive: Receive, send: Send) -> None:
    call = await _admit(state, request, send)
    if call is None:
        return
    try:
        if not isinstance(call.body.get("messages"), list) or not call.body["messages"]:
            raise SimRequestError("messages: Field required")
        blocks = prompt_blocks(call.body, ENCODING)
    except SimRequestError as error:
        await reply(state, send, 400, error_body("invalid_request_error", error.message, call.request_id), call.headers)
        return
    await reply(state, send, 200, {"input_tokens": total_tokens(blocks)}, call.headers)


async def _gate(state: AnthropicState, call: Call, send: Send, input_tokens: int) -> bool:
    cfg = state.config
    if cfg.spend_limited:
        # Out of credit: a 429 with no retry-after, which no retry can fix.
        message = "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."
        await reply(state, send, 429, error_body("rate_limit_error", message, call.request_id), call.headers)
        return False
    limit_headers, exceeded, wait = state.limits.check(cfg, call.model, input_tokens, int(call.body["max_tokens"]))
    call.headers.extend(limit_headers)
    if exceeded is not None:
        message = f"This request would exceed the rate limit for your organization of {exceeded.replace('-', ' ')} per minute."
        await reply(state, send, 429, error_body("rate_limit_error", message, call.request_id), [*call.headers, *retry_after_headers(wait)[:1]])
        return False
    draw = seeded_rng("fault", cfg.seed, state.next_counter()).random()
    if draw < cfg.fail_429_rate:
        state.stats.injected_faults += 1
        message = "Number of request tokens has exceeded your per-minute rate limit."
        headers = [*call.headers, *retry_after_headers(cfg.retry_after_s)[:1]]
        await reply(state, send, 429, error_body("rate_limit_error", message, call.request_id), headers)
        return False
    if draw < cfg.fail_429_rate + cfg.fail_529_rate:
        state.stats.injected_faults += 1
        await reply(state, send, 529, error_body("overloaded_error", "Overloaded", call.request_id), call.headers)
        return False
    return True


def usage_json(usage: CacheUsage, output: int) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation,
        "cache_read_input_tokens": usage.cache_read,
        "cache_creation": {"ephemeral_5m_input_tokens": usage.cache_write_5m, "ephemeral_1h_input_tokens": usage.cache_write_1h},
        "output_tokens": output,
        "service_tier": "standard",
    }


def _message(call: Call, message_id: str, plan: MessagePlan, usage: CacheUsage) -> dict[str, Any]:
    return {
        "id": message_id, "type": "message", "role": "assistant", "model": call.model,
        "content": [b.as_content() for b in plan.blocks],
        "stop_reason": plan.stop_reason, "stop_sequence": plan.stop_sequence,
        "usage": usage_json(usage, plan.output_tokens),
    }


def _bill(state: AnthropicState, call: Call, usage: CacheUsage, output: int) -> None:
    state.usage.add(MessagesUsage(time.time(), call.model, call.key_id, call.request_id, usage.input_tokens,
                                  usage.cache_read, usage.cache_write_5m, usage.cache_write_1h, output))


async def messages(state: AnthropicState, request: HttpRequest, receive: Receive, send: Send) -> None:
    call = await _admit(state, request, send)
    if call is None:
        return
    try:
        validate(call.body, request.headers.get("anthropic-beta", ""))
        blocks = prompt_blocks(call.body, ENCODING)
        plan = plan_message(call.body, state.config.seed, state.config.output_tokens, ENCODING)
    except SimRequestError as error:
        await reply(state, send, error.status, error_body("invalid_request_error", error.message, call.request_id), call.headers)
        return
    # Cache reads do not count against the input-token limit.
    if not await _gate(state, call, send, total_tokens(blocks)):
        return
    usage = state.cache.use(f"{call.model}\x00{call.key_id}", blocks)
    cfg = state.config
    watch = DisconnectWatch(receive) if cfg.latency_s > 0 or (call.body.get("stream") and cfg.token_delay_s > 0) else None
    try:
        if watch is not None and await watch.sleep(cfg.latency_s):
            state.stats.aborted += 1
            return
        message = _message(call, state.new_id("msg_", 12), plan, usage)
        if call.body.get("stream") is True:
            await _stream(state, call, message, plan, usage, watch, send)
            return
        await reply(state, send, 200, message, call.headers)
        _bill(state, call, usage, plan.output_tokens)
    finally:
        if watch is not None:
            watch.close()


def event(name: str, payload: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _block_start(block: dict[str, Any]) -> dict[str, Any]:
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": ""}
    if kind == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}


def _delta(kind: str, piece: str) -> dict[str, Any]:
    if kind == "text":
        return {"type": "text_delta", "text": piece}
    if kind == "thinking":
        return {"type": "thinking_delta", "thinking": piece}
    return {"type": "input_json_delta", "partial_json": piece}


async def _stream(state: AnthropicState, call: Call, message: dict[str, Any], plan: MessagePlan, usage: CacheUsage,
                  watch: DisconnectWatch | None, send: Send) -> None:
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage_json(usage, 1)}
    delay = state.config.token_delay_s
    state.stats.count_status(200)
    state.stats.active_streams += 1
    sent = 0
    try:
        await start_sse(send, call.headers)
        await send_sse_chunk(send, event("message_start", {"type": "message_start", "message": start}))
        for index, (block, content) in enumerate(zip(plan.blocks, message["content"], strict=True)):
            opening = {"type": "content_block_start", "index": index, "content_block": _block_start(content)}
            await send_sse_chunk(send, event("content_block_start", opening))
            if index == 0:
                await send_sse_chunk(send, event("ping", {"type": "ping"}))
            for piece in block.pieces:
                if watch is not None and await watch.sleep(delay):
                    state.stats.aborted += 1
                    _bill(state, call, usage, sent)  # Anthropic bills what it generated
                    return
                sent += 1
                delta = {"type": "content_block_delta", "index": index, "delta": _delta(block.type, piece)}
                await send_sse_chunk(send, event("content_block_delta", delta))
            if block.type == "thinking":
                signature = {"type": "content_block_delta", "index": index,
                             "delta": {"type": "signature_delta", "signature": block.signature}}
                await send_sse_chunk(send, event("content_block_delta", signature))
            await send_sse_chunk(send, event("content_block_stop", {"type": "content_block_stop", "index": index}))
        final_usage = usage_json(usage, sent)
        final_usage.pop("service_tier")
        final_usage.pop("cache_creation")
        delta = {"type": "message_delta", "delta": {"stop_reason": plan.stop_reason, "stop_sequence": plan.stop_sequence},
                 "usage": final_usage}
        await send_sse_chunk(send, event("message_delta", delta))
        await send_sse_chunk(send, event("message_stop", {"type": "message_stop"}))
        await end_body(send)
        _bill(state, call, usage, sent)
    finally:
        state.stats.active_streams -= 1
