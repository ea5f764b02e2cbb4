"""The hosted-provider simulator: an OpenAI-compatible API as a raw ASGI app.

Routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
the organization usage and costs reports, and `/sim/*` controls for tests
(stats, runtime config, reset, usage inject/omit, and each chat answer's truth
under its quality profile: `GET /sim/truth/{response id}`).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

from gateway.sim import hosted_inference
from gateway.sim.asgi import Handler, HttpRequest, Receive, RoutedApp, Send, send_json
from gateway.sim.generation import SimRequestError
from gateway.sim.hosted_faults import openai_error
from gateway.sim.hosted_state import HostedSimConfig, HostedSimStats, HostedState
from gateway.sim.runtime_config import patch_config
from gateway.sim.usage_report import UsageLedger, UsageRecord, costs_page, injected_record, usage_page

__all__ = ["HostedSimConfig", "HostedSimStats", "HostedSimulator", "create_hosted_app"]

MODEL_CREATED = 1_700_000_000


class HostedSimulator(RoutedApp):
    """ASGI app; `config` may be changed in place (or via `POST /sim/config`) while serving."""

    def __init__(self, config: HostedSimConfig, usage_journal: Path | None = None) -> None:
        self.state = HostedState(config, usage=UsageLedger.kept_in(usage_journal, UsageRecord) if usage_journal is not None else UsageLedger())
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): partial(hosted_inference.chat, self.state),
            ("POST", "/v1/completions"): partial(hosted_inference.completions, self.state),
            ("POST", "/v1/embeddings"): partial(hosted_inference.embeddings, self.state),
            ("GET", "/v1/models"): self._models,
            # OpenAI has none, but most OpenAI-compatible servers (vLLM, TGI, SGLang) do,
            # and routers that health-check their workers (vllm-router) ask for it.
            ("GET", "/health"): self._health,
            ("GET", "/v1/organization/usage/completions"): partial(self._report, "completions"),
            ("GET", "/v1/organization/usage/embeddings"): partial(self._report, "embeddings"),
            ("GET", "/v1/organization/costs"): partial(self._report, "costs"),
            ("GET", "/sim/stats"): self._stats,
            ("GET", "/sim/config"): self._get_config,
            ("POST", "/sim/config"): self._patch_config,
            ("POST", "/sim/reset"): self._reset,
            ("GET", "/sim/usage"): self._usage_records,
            ("POST", "/sim/usage/inject"): self._inject,
            ("POST", "/sim/usage/omit"): self._omit,
        }

    @property
    def config(self) -> HostedSimConfig:
        return self.state.config

    @property
    def stats(self) -> HostedSimStats:
        return self.state.stats

    @property
    def usage(self) -> UsageLedger[UsageRecord]:
        return self.state.usage

    async def unrouted(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        if request.method == "GET" and request.path.startswith("/v1/models/"):
            await self._model(request, receive, send)
        elif request.method == "GET" and request.path.startswith("/sim/truth/"):
            await self._truth(request, receive, send)
        else:
            message = f"Invalid URL ({request.method} {request.path})"
            await send_json(send, 404, openai_error(message, "invalid_request_error"))

    def _model_object(self, model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": MODEL_CREATED, "owned_by": "system"}

    async def _health(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"status": "ok"})

    async def _models(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        data = [self._model_object(m) for m in self.config.models]
        await send_json(send, 200, {"object": "list", "data": data})

    async def _model(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        model = request.path.removeprefix("/v1/models/")
        if model in self.config.models:
            await send_json(send, 200, self._model_object(model))
            return
        message = f"The model `{model}` does not exist or you do not have access to it."
        await send_json(send, 404, openai_error(message, "invalid_request_error", None, "model_not_found"))

    async def _report(self, kind: str, request: HttpRequest, receive: Receive, send: Send) -> None:
        if not request.headers.get("authorization", "")[7:].strip():
            await send_json(send, 401, openai_error("Missing admin API key.", "invalid_request_error", None, "invalid_api_key"))
            return
        try:
            if kind == "costs":
                page = costs_page(self.usage, request.query, self.config.prices)
            else:
                page = usage_page(self.usage, request.query, kind)
        except SimRequestError as error:
            await send_json(send, 400, openai_error(error.message, "invalid_request_error", error.param))
            return
        await send_json(send, 200, page)

    async def _truth(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        response_id = request.path.removeprefix("/sim/truth/")
        truth = self.state.truth.lookup(response_id)
        if truth is None:
            message = f"No chat response with id {response_id!r} (unknown, or evicted from the last {len(self.state.truth)})."
            await send_json(send, 404, openai_error(message, "invalid_request_error", "id"))
            return
        await send_json(send, 200, truth)

    async def _stats(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        snapshot = self.stats.snapshot()
        snapshot["usage_records"] = len(self.usage.records)
        await send_json(send, 200, snapshot)

    async def _get_config(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.config.to_json())

    async def _patch_config(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            patch_config(self.config, _json_body(request))
        except SimRequestError as error:
            await send_json(send, 400, openai_error(error.message, "invalid_request_error", error.param))
            return
        await send_json(send, 200, self.config.to_json())

    async def _reset(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        self.state.reset()
        await send_json(send, 200, {"reset": True})

    async def _usage_records(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        records = [dataclasses.asdict(r) for r in self.usage.records]
        await send_json(send, 200, {"object": "list", "data": records})

    async def _inject(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            record = injected_record(_json_body(request), "req_" + self.state.new_hex(16))
        except SimRequestError as error:
            await send_json(send, 400, openai_error(error.message, "invalid_request_error", error.param))
            return
        self.usage.add(record)
        await send_json(send, 200, dataclasses.asdict(record))

    async def _omit(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            body = _json_body(request)
        except SimRequestError:
            body = None
        request_id = body.get("request_id") if isinstance(body, dict) else None
        if not isinstance(request_id, str) or not self.usage.omit(request_id):
            message = f"No billed request with request_id {request_id!r}."
            await send_json(send, 404, openai_error(message, "invalid_request_error", "request_id"))
            return
        await send_json(send, 200, {"omitted": request_id})


def _json_body(request: HttpRequest) -> Any:
    try:
        return request.json()
    except ValueError:
        raise SimRequestError("Expected a JSON body.") from None


def create_hosted_app(config: HostedSimConfig | None = None, usage_journal: Path | None = None) -> HostedSimulator:
    """`usage_journal`: a file that keeps the usage report across restarts (UsageLedger)."""
    return HostedSimulator(config or HostedSimConfig(), usage_journal)
