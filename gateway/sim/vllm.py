"""The vLLM simulator: vLLM's OpenAI-compatible server surface as a raw ASGI app.

Routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`,
`/version`, `/metrics`, `/reset_prefix_cache`, and `/sim/*` controls for tests.
No auth, vLLM's error shape (`code` is the integer status), `cache_salt` and the other
vLLM-only request fields.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from gateway.sim.asgi import (
    SSE_DONE,
    Handler,
    HttpRequest,
    Receive,
    RoutedApp,
    Send,
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
    output_bound,
    plan_chat,
    plan_completion,
)
from gateway.sim.prefix_cache import block_hashes
from gateway.sim.prompts import render_chat, token_ids
from gateway.sim.runtime_config import patch_config
from gateway.sim.shapes import (
    Dialect,
    StreamStep,
    chat_completion,
    chat_stream_steps,
    completion_stream_steps,
    text_completion,
    usage_chunk,
)
from gateway.sim.vllm_engine import EngineRequest, VllmEngine, VllmSimConfig, VllmSimStats

__all__ = ["VllmSimConfig", "VllmSimStats", "VllmSimulator", "create_vllm_app"]

DIALECT = Dialect(
    message_extras=MappingProxyType({
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [],
        "reasoning_content": None,
    }),
    choice_extras=MappingProxyType({"stop_reason": None}),
)
_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError"}


def vllm_error(message: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "InternalServerError"), "param": None, "code": status}}


class VllmSimulator(RoutedApp):
    """ASGI app; `config` may be changed in place (or via `POST /sim/config`) while serving."""

    def __init__(self, config: VllmSimConfig) -> None:
        self.engine = VllmEngine(config)
        self._ids = random.Random()  # system entropy: ids stay unique across restarts
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/version"): self._version,
            ("GET", "/metrics"): self._metrics,
            ("POST", "/reset_prefix_cache"): self._reset_prefix_cache,
            ("GET", "/sim/stats"): self._stats,
            ("GET", "/sim/config"): self._get_config,
            ("POST", "/sim/config"): self._patch_config,
            ("POST", "/sim/reset"): self._reset,
        }

    @property
    def config(self) -> VllmSimConfig:
        return self.engine.config

    @property
    def stats(self) -> VllmSimStats:
        return self.engine.stats

    # -- inference -------------------------------------------------------------------

    async def _reply(self, send: Send, status: int, payload: Any) -> None:
        self.stats.count_status(status)
        await send_json(send, status, payload)

    def _parse(self, request: HttpRequest) -> dict[str, Any]:
        """Body checks vLLM's request models make before anything is scheduled."""
        stats = self.stats
        stats.requests += 1
        stats.last_authorization = request.headers.get("authorization")
        stats.last_headers = request.headers
        try:
            body = request.json()
        except ValueError:
            raise SimRequestError("Invalid JSON body.") from None
        if not isinstance(body, dict):
            raise SimRequestError("Expected a JSON object.")
        stats.last_body = body
        model = body.get("model")
        if model is not None and model not in self.config.names:
            raise SimRequestError(f"The model `{model}` does not exist.", "model", status=404)
        salt = body.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise SimRequestError("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
        if body.get("stream_options") is not None and body.get("stream") is not True:
            raise SimRequestError("Stream options can only be defined when `stream=True`.", "stream_options")
        return body

    def _settings(self) -> GenerationSettings:
        return GenerationSettings(self.config.seed, self.config.output_tokens)

    async def _chat(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            body = self._parse(request)
            plans = plan_chat(body, self._settings())
        except SimRequestError as error:
            await self._reply(send, error.status, vllm_error(error.message, error.status))
            return
        prompt = token_ids(render_chat(body["messages"], body.get("tools")))
        await self._generate("chat", body, plans, prompt, receive, send)

    async def _completions(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            body = self._parse(request)
            prompts = completion_prompts(body)
            plans = plan_completion(body, prompts, self._settings())
        except SimRequestError as error:
            await self._reply(send, error.status, vllm_error(error.message, error.status))
            return
        # A batch of prompts is served as one engine request over their concatenation.
        prompt = [t for p in prompts for t in token_ids(p)]
        await self._generate("completion", body, plans, prompt, receive, send)

    def _usage(self, prompt_tokens: int, completion: int, cached: int) -> dict[str, Any]:
        details = None
        if self.config.enable_prompt_tokens_details and cached:
            details = {"cached_tokens": cached}
        return {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": details,
        }

    async def _generate(
        self, kind: str, body: dict[str, Any], plans: list[ChoicePlan], prompt: list[int], receive: Receive, send: Send
    ) -> None:
        cfg = self.config
        completion = sum(p.completion_tokens for p in plans)
        requested = len(prompt) + (output_bound(body) or 0)
        if requested > cfg.max_model_len or not self.engine.fits(len(prompt) + completion):
            message = (
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
                f"{requested} tokens ({len(prompt)} in the messages, {requested - len(prompt)} in the completion). "
                "Please reduce the length of the messages or completion."
            )
            await self._reply(send, 400, vllm_error(message, 400))
            return
        salt = body.get("cache_salt")
        hashes = block_hashes(prompt, cfg.block_size, salt, cfg.seed.to_bytes(8, "big", signed=True)) if cfg.enable_prefix_caching else []
        longest = max(p.completion_tokens for p in plans)
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        request = EngineRequest(prefix + self._ids.randbytes(16).hex(), prompt, hashes, completion, longest)
        if not await self.engine.start(request, receive):
            return
        try:
            await self._respond(kind, body, plans, request, receive, send)
        finally:
            self.engine.finish(request, "abort")  # no-op unless something cut the response short

    async def _respond(
        self, kind: str, body: dict[str, Any], plans: list[ChoicePlan], request: EngineRequest, receive: Receive, send: Send
    ) -> None:
        header = {"id": request.request_id, "created": int(time.time()), "model": body.get("model") or self.config.names[0]}
        if body.get("stream") is True:
            await self._stream(kind, body, plans, request, header, receive, send)
            return
        if not await self.engine.decode_all(request, receive):
            return
        self.engine.finish(request, plans[0].finish_reason)
        completion = request.completion_tokens
        usage = self._usage(request.prompt_tokens, completion, request.cached_tokens)
        if kind == "chat":
            payload = chat_completion(header, plans, usage, DIALECT)
            payload.update(service_tier=None, system_fingerprint=None, prompt_logprobs=None, kv_transfer_params=None)
        else:
            payload = text_completion(header, plans, usage, DIALECT)
        await self._reply(send, 200, payload)

    def _usage_options(self, body: Mapping[str, Any]) -> tuple[bool, bool]:
        """(include_usage, continuous_usage_stats); vLLM defaults include_usage to true."""
        options = body.get("stream_options")
        if self.config.enable_force_include_usage:
            return True, True
        if not isinstance(options, Mapping):
            return False, False
        return bool(options.get("include_usage", True)), bool(options.get("continuous_usage_stats", False))

    async def _stream(
        self,
        kind: str,
        body: dict[str, Any],
        plans: list[ChoicePlan],
        request: EngineRequest,
        header: dict[str, Any],
        receive: Receive,
        send: Send,
    ) -> None:
        include_usage, continuous = self._usage_options(body)
        steps: Iterator[StreamStep] = (
            chat_stream_steps(header, plans, DIALECT) if kind == "chat" else completion_stream_steps(header, plans, DIALECT)
        )
        self.stats.count_status(200)
        await start_sse(send)
        position = 0  # the first token comes out of prefill; each later position is one decode step
        for step in steps:
            if step.position > position:
                position = step.position
                if not await self.engine.decode_step(request, receive):
                    return  # aborted: the connection is gone, leave the body unterminated
            request.generated += step.tokens
            if continuous:
                step.chunk["usage"] = self._usage(request.prompt_tokens, request.generated, request.cached_tokens)
            await send_sse_chunk(send, sse_event(step.chunk))
        self.engine.finish(request, plans[0].finish_reason)
        if include_usage:
            object_name = "chat.completion.chunk" if kind == "chat" else "text_completion"
            usage = self._usage(request.prompt_tokens, request.generated, request.cached_tokens)
            await send_sse_chunk(send, sse_event(usage_chunk(header, object_name, usage)))
        await send_sse_chunk(send, SSE_DONE)
        await end_body(send)

    # -- server endpoints ------------------------------------------------------------

    async def _models(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        created = int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": self.config.model,
             "parent": None, "max_model_len": self.config.max_model_len}
            for name in self.config.names
        ]
        await send_json(send, 200, {"object": "list", "data": data})

    async def _health(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, b"")

    async def _version(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"version": "0.11.0-sim"})

    async def _metrics(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        engine = self.engine
        text = engine.metrics.render(engine.scheduler.running, engine.scheduler.waiting, engine.cache.usage)
        await send_bytes(send, 200, text, [(b"content-type", CONTENT_TYPE_LATEST.encode())])

    async def _reset_prefix_cache(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        self.engine.cache.reset()
        self.engine.publish_events()
        await send_bytes(send, 200, b"")

    async def _stats(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.engine.snapshot())

    async def _get_config(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        await send_json(send, 200, dataclasses.asdict(self.config))

    async def _patch_config(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            patch_config(self.config, request.json())
        except (SimRequestError, ValueError) as error:
            await send_json(send, 400, vllm_error(str(error), 400))
            return
        if not self.engine.reconfigure():
            await send_json(send, 409, vllm_error("KV cache geometry can only change while idle.", 409))
            return
        await send_json(send, 200, dataclasses.asdict(self.config))

    async def _reset(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        self.engine.reset()
        await send_json(send, 200, {"reset": True})


def create_vllm_app(config: VllmSimConfig | None = None) -> VllmSimulator:
    return VllmSimulator(config or VllmSimConfig())
