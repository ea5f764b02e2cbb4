"""The hosted simulator's inference endpoints: chat, legacy completions, embeddings.

Each request passes the same gates as at OpenAI, in the same order: auth, body and
model, validation, rate limits, then (injected) provider trouble, latency and the
answer, which is billed to the usage report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gateway.sim.asgi import (
    JSON_TYPE,
    SSE_DONE,
    SSE_TYPE,
    DisconnectWatch,
    HttpRequest,
    Receive,
    Send,
    cut_connection,
    end_body,
    send_bytes,
    send_json,
    send_sse_chunk,
    sse_event,
    start_sse,
)
from gateway.sim.generation import (
    ChoicePlan,
    GenerationSettings,
    SimRequestError,
    completion_prompts,
    int_field,
    output_bound,
    plan_completion,
)
from gateway.sim.hosted_cache import MIN_CACHED_TOKENS
from gateway.sim.hosted_faults import (
    MALFORMED_JSON_BODY,
    MALFORMED_SSE_BODY,
    Fault,
    draw_fault,
    injected_rate_limit_body,
    openai_error,
    server_error_body,
)
from gateway.sim.hosted_state import HostedState
from gateway.sim.prompts import render_chat, token_ids
from gateway.sim.quality import Truth, plan_chat_with_quality
from gateway.sim.ratelimit import retry_after_headers
from gateway.sim.shapes import (
    Dialect,
    StreamStep,
    chat_completion,
    chat_stream_steps,
    completion_stream_steps,
    text_completion,
    usage_chunk,
)
from gateway.sim.textgen import embedding_vector, encode_base64_floats
from gateway.sim.usage_report import api_key_id
from gateway.tokens.counting import count_chat_tokens, count_text_tokens, encoding_name_for_model

DIALECT = Dialect(
    message_extras=MappingProxyType({"refusal": None, "annotations": []}),
    first_delta_extras=MappingProxyType({"refusal": None}),
)
SYSTEM_FINGERPRINT = "fp_sim0000001"
# The most `dimensions` an embedding model has (text-embedding-3-large); more is refused.
MAX_EMBEDDING_DIMS = 3072


@dataclass
class Call:
    """One authenticated inference request for a known model."""

    model: str
    body: dict[str, Any]
    key_id: str
    request_id: str
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True


async def reply(state: HostedState, send: Send, status: int, payload: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    state.stats.count_status(status)
    await send_json(send, status, payload, headers)


async def _admit(state: HostedState, request: HttpRequest, send: Send) -> Call | None:
    """Auth, JSON body and model; answers the error itself and returns None on failure."""
    stats = state.stats
    stats.requests += 1
    auth = request.headers.get("authorization", "")
    stats.last_authorization = auth or None
    stats.last_headers = request.headers
    if state.config.require_auth and (not auth[7:].strip() or auth[:7].lower() != "bearer "):
        message = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        await reply(state, send, 401, openai_error(message, "invalid_request_error", None, "invalid_api_key"))
        return None
    try:
        body = request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        message = "We could not parse the JSON body of your request. The OpenAI API expects a JSON payload."
        await reply(state, send, 400, openai_error(message, "invalid_request_error"))
        return None
    stats.last_body = body
    model = body.get("model")
    if not isinstance(model, str) or not model:
        await reply(state, send, 400, openai_error("You must provide a model parameter.", "invalid_request_error", "model"))
        return None
    if model not in state.config.models:
        message = f"The model `{model}` does not exist or you do not have access to it."
        await reply(state, send, 404, openai_error(message, "invalid_request_error", None, "model_not_found"))
        return None
    call = Call(model, body, api_key_id(auth), "req_" + state.new_hex(16))
    call.headers.append((b"x-request-id", call.request_id.encode()))
    return call


async def _bad_request(state: HostedState, send: Send, call: Call, error: SimRequestError) -> None:
    await reply(state, send, error.status, openai_error(error.message, "invalid_request_error", error.param, error.code), call.headers)


async def _gate(state: HostedState, call: Call, send: Send, tokens: int) -> tuple[bool, Fault | None]:
    """Rate limits, then injected faults; (False, _) when an error was already sent."""
    cfg = state.config
    decision = state.rate_limiter.check(call.model, cfg.rpm, cfg.tpm, tokens)
    call.headers.extend(decision.headers)
    if decision.exceeded is not None:
        body = openai_error(decision.message, decision.exceeded, None, "rate_limit_exceeded")
        await reply(state, send, 429, body, [*call.headers, *retry_after_headers(decision.retry_after_s)])
        return False, None
    fault, status = draw_fault(cfg.fault_rates(), state.next_counter(), call.stream)
    if fault is Fault.RATE_LIMITED:
        state.stats.injected_faults += 1
        headers = [*call.headers, *retry_after_headers(cfg.retry_after_s)]
        await reply(state, send, 429, injected_rate_limit_body(call.model), headers)
        return False, fault
    if fault is Fault.SERVER_ERROR:
        state.stats.injected_faults += 1
        await reply(state, send, status, server_error_body(status, cfg.server_error_message), call.headers)
        return False, fault
    return True, fault


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


def _check_stream_options(body: Mapping[str, Any]) -> None:
    if body.get("stream_options") is not None and body.get("stream") is not True:
        raise SimRequestError("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")


@dataclass(frozen=True)
class Answer:
    """A planned completion and what its prompt costs."""

    kind: str  # "chat" | "completion"
    plans: list[ChoicePlan]
    prompt_tokens: int
    cache_sources: Callable[[], list[list[int]]]
    truth: Truth | None = None  # chat: kept under the response id for GET /sim/truth/{id}

    @property
    def completion_tokens(self) -> int:
        return sum(p.completion_tokens for p in self.plans)


def _usage(answer: Answer, cached: int, completion: int) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": answer.prompt_tokens + completion,
    }
    if answer.kind == "chat":
        usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        usage["completion_tokens_details"] = {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        }
    return usage


def _header(state: HostedState, call: Call, answer: Answer) -> dict[str, Any]:
    kind = answer.kind
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    header: dict[str, Any] = {"id": prefix + state.new_hex(12), "created": int(time.time()), "model": call.model}
    if answer.truth is not None:
        state.truth.record(header["id"], call.model, answer.truth)
    if kind == "chat":
        tier = call.body.get("service_tier")
        header["service_tier"] = tier if isinstance(tier, str) and tier != "auto" else "default"
    header["system_fingerprint"] = SYSTEM_FINGERPRINT
    return header


def _cached_tokens(state: HostedState, call: Call, answer: Answer) -> int:
    if not state.config.prompt_caching or answer.prompt_tokens < MIN_CACHED_TOKENS:
        return 0
    scope = f"{call.model}\x00{call.body.get('prompt_cache_key') or ''}"
    cached = sum(state.prompt_cache.lookup_and_store(scope, tokens) for tokens in answer.cache_sources())
    return min(state.provider_tokens(cached), answer.prompt_tokens)


async def _answer(state: HostedState, call: Call, answer: Answer, receive: Receive, send: Send) -> None:
    cfg = state.config
    bound = (output_bound(call.body) or cfg.output_tokens) * len(answer.plans)
    admitted, fault = await _gate(state, call, send, answer.prompt_tokens + bound)
    if not admitted:
        return
    cached = _cached_tokens(state, call, answer)
    delays = cfg.latency_s > 0 or (call.stream and cfg.token_delay_s > 0)
    watch = DisconnectWatch(receive) if delays else None
    try:
        if watch is not None and await watch.sleep(cfg.latency_s):
            state.stats.aborted += 1
            return
        if fault is Fault.MALFORMED:
            state.stats.malformed += 1
            state.stats.count_status(200)
            garbage, kind = (MALFORMED_SSE_BODY, SSE_TYPE) if call.stream else (MALFORMED_JSON_BODY, JSON_TYPE)
            await send_bytes(send, 200, garbage, [kind, *call.headers])
        elif call.stream:
            await _stream(state, call, answer, cached, fault is Fault.CUT_STREAM, watch, send)
            return
        else:
            usage = _usage(answer, cached, answer.completion_tokens)
            build = chat_completion if answer.kind == "chat" else text_completion
            await reply(state, send, 200, build(_header(state, call, answer), answer.plans, usage, DIALECT), call.headers)
        _bill(state, call, answer, cached, answer.completion_tokens)
    finally:
        if watch is not None:
            watch.close()


def _bill(state: HostedState, call: Call, answer: Answer, cached: int, completion: int) -> None:
    state.record_usage("completions", call.model, call.key_id, call.request_id, answer.prompt_tokens, cached, completion)


async def _stream(
    state: HostedState, call: Call, answer: Answer, cached: int, cut: bool, watch: DisconnectWatch | None, send: Send
) -> None:
    include_usage = _include_usage(call.body)
    header = _header(state, call, answer)
    if include_usage:
        header["usage"] = None  # OpenAI sends an explicit null on every chunk before the usage chunk
    steps: Iterator[StreamStep] = (
        chat_stream_steps(header, answer.plans, DIALECT)
        if answer.kind == "chat"
        else completion_stream_steps(header, answer.plans, DIALECT)
    )
    cut_after = answer.completion_tokens // 2 if cut else None
    delay = state.config.token_delay_s
    state.stats.count_status(200)
    state.stats.active_streams += 1
    sent = 0
    try:
        await start_sse(send, call.headers)
        for step in steps:
            if step.tokens:
                if cut_after is not None and sent >= cut_after:
                    state.stats.cut_streams += 1
                    _bill(state, call, answer, cached, sent)  # the provider bills what it generated
                    raise cut_connection()
                if watch is not None and await watch.sleep(delay):
                    state.stats.aborted += 1
                    _bill(state, call, answer, cached, sent)
                    return
            await send_sse_chunk(send, sse_event(step.chunk))
            sent += step.tokens
        if include_usage:
            object_name = "chat.completion.chunk" if answer.kind == "chat" else "text_completion"
            chunk = usage_chunk(header, object_name, _usage(answer, cached, sent))
            await send_sse_chunk(send, sse_event(chunk))
        await send_sse_chunk(send, SSE_DONE)
        await end_body(send)
        _bill(state, call, answer, cached, sent)
    finally:
        state.stats.active_streams -= 1


def _settings(state: HostedState, model: str) -> GenerationSettings:
    return GenerationSettings(state.config.seed, state.config.output_tokens, encoding_name_for_model(model))


async def chat(state: HostedState, request: HttpRequest, receive: Receive, send: Send) -> None:
    call = await _admit(state, request, send)
    if call is None:
        return
    try:
        _check_stream_options(call.body)
        profile = state.config.quality.get(call.model)
        plans, truth = plan_chat_with_quality(call.body, _settings(state, call.model), call.model, profile)
    except SimRequestError as error:
        await _bad_request(state, send, call, error)
        return
    encoding = encoding_name_for_model(call.model)
    messages, tools = call.body["messages"], call.body.get("tools")
    answer = Answer(
        "chat",
        plans,
        state.provider_tokens(count_chat_tokens(messages, encoding)),
        lambda: [token_ids(render_chat(messages, tools), encoding)],
        truth,
    )
    await _answer(state, call, answer, receive, send)


async def completions(state: HostedState, request: HttpRequest, receive: Receive, send: Send) -> None:
    call = await _admit(state, request, send)
    if call is None:
        return
    try:
        _check_stream_options(call.body)
        prompts = completion_prompts(call.body)
        plans = plan_completion(call.body, prompts, _settings(state, call.model))
    except SimRequestError as error:
        await _bad_request(state, send, call, error)
        return
    encoding = encoding_name_for_model(call.model)
    tokens = [token_ids(p, encoding) for p in prompts]
    counted = sum(state.provider_tokens(len(t)) if isinstance(p, str) else len(t) for p, t in zip(prompts, tokens, strict=True))
    answer = Answer("completion", plans, counted, lambda: tokens)
    await _answer(state, call, answer, receive, send)


def _embedding_inputs(body: Mapping[str, Any]) -> list[str | list[int]]:
    raw = body.get("input")
    if isinstance(raw, str) and raw:
        return [raw]
    if isinstance(raw, list) and raw:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            return [list(raw)]
        if all((isinstance(x, str) and x) or (isinstance(x, list) and x) for x in raw):
            return list(raw)
    raise SimRequestError("'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference.", "input")


async def embeddings(state: HostedState, request: HttpRequest, receive: Receive, send: Send) -> None:
    call = await _admit(state, request, send)
    if call is None:
        return
    try:
        inputs = _embedding_inputs(call.body)
        fmt = call.body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise SimRequestError(f"Invalid 'encoding_format': {fmt!r}.", "encoding_format")
        dims = int_field(call.body, "dimensions", 1) or state.config.embedding_dims
        if dims > MAX_EMBEDDING_DIMS:
            raise SimRequestError(f"Invalid 'dimensions': expected an integer from 1 to {MAX_EMBEDDING_DIMS}, got {dims}.",
                                  "dimensions")
    except SimRequestError as error:
        await _bad_request(state, send, call, error)
        return
    encoding = encoding_name_for_model(call.model)
    tokens = sum(state.provider_tokens(count_text_tokens(x, encoding)) if isinstance(x, str) else len(x) for x in inputs)
    admitted, fault = await _gate(state, call, send, tokens)
    if not admitted:
        return
    cfg = state.config
    if cfg.latency_s > 0:
        watch = DisconnectWatch(receive)
        gone = await watch.sleep(cfg.latency_s)
        watch.close()
        if gone:
            state.stats.aborted += 1
            return
    state.record_usage("embeddings", call.model, call.key_id, call.request_id, tokens, 0, 0)
    if fault is Fault.MALFORMED:
        state.stats.malformed += 1
        state.stats.count_status(200)
        await send_bytes(send, 200, MALFORMED_JSON_BODY, [JSON_TYPE, *call.headers])
        return
    data = []
    for index, item in enumerate(inputs):
        vector = embedding_vector(item, dims, cfg.seed)
        data.append({"object": "embedding", "index": index, "embedding": encode_base64_floats(vector) if fmt == "base64" else vector})
    payload = {"object": "list", "data": data, "model": call.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    await reply(state, send, 200, payload, call.headers)
