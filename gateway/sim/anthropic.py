"""The Anthropic simulator: a Messages API as a raw ASGI app.

Routes: `POST /v1/messages`, `POST /v1/messages/count_tokens`, `GET /v1/models`, the
Admin API's usage and cost reports (an admin key, `sk-ant-admin...`, in `x-api-key`),
and `/sim/*` controls for tests (stats, config, reset, the billed calls, and billing a
call the gateway never saw: `POST /sim/usage/inject`).
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from pathlib import Path

from gateway.sim import anthropic_messages
from gateway.sim.anthropic_messages import error_body, reply
from gateway.sim.anthropic_reports import cost_report, injected_usage, usage_report
from gateway.sim.anthropic_state import AnthropicSimConfig, AnthropicSimStats, AnthropicState, MessagesUsage
from gateway.sim.asgi import Handler, HttpRequest, Receive, RoutedApp, Send, send_json
from gateway.sim.generation import SimRequestError
from gateway.sim.runtime_config import patch_config
from gateway.sim.usage_report import UsageLedger

__all__ = ["AnthropicSimConfig", "AnthropicSimStats", "AnthropicSimulator", "create_anthropic_app"]

MODEL_CREATED = "2024-10-22T00:00:00Z"


class AnthropicSimulator(RoutedApp):
    """ASGI app; `config` may be changed in place (or via `POST /sim/config`) while serving."""

    def __init__(self, config: AnthropicSimConfig, usage_journal: Path | None = None) -> None:
        usage = UsageLedger.kept_in(usage_journal, MessagesUsage) if usage_journal is not None else UsageLedger()
        self.state = AnthropicState(config, usage=usage)
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/messages"): partial(anthropic_messages.messages, self.state),
            ("POST", "/v1/messages/count_tokens"): partial(anthropic_messages.count_tokens, self.state),
            ("GET", "/v1/models"): self._models,
            ("GET", "/v1/organizations/usage_report/messages"): partial(self._report, "usage"),
            ("GET", "/v1/organizations/cost_report"): partial(self._report, "cost"),
            ("GET", "/sim/stats"): self._stats,
            ("GET", "/sim/config"): self._get_config,
            ("POST", "/sim/config"): self._patch_config,
            ("POST", "/sim/reset"): self._reset,
            ("GET", "/sim/usage"): self._usage,
            ("POST", "/sim/usage/inject"): self._inject,
        }

    @property
    def config(self) -> AnthropicSimConfig:
        return self.state.config

    @property
    def stats(self) -> AnthropicSimStats:
        return self.state.stats

    async def unrouted(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        await send_json(send, 404, error_body("not_found_error", f"Not found: {request.method} {request.path}"))

    async def _models(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        data = [{"type": "model", "id": m, "display_name": m, "created_at": MODEL_CREATED} for m in self.config.models]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        await send_json(send, 200, {"data": data, "has_more": False, "first_id": first, "last_id": last})

    async def _report(self, kind: str, request: HttpRequest, receive: Receive, send: Send) -> None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        key = request.headers.get("x-api-key", "") or (token.strip() if scheme.lower() == "bearer" else "")
        if not key.startswith(self.config.admin_key_prefix):
            await send_json(send, 401, error_body("authentication_error", "this endpoint needs an Admin API key (sk-ant-admin...)"))
            return
        try:
            if kind == "usage":
                page = usage_report(self.state.usage.records, request.query, time.time())
            else:
                page = cost_report(self.state.usage.records, request.query, self.config.prices, time.time())
        except SimRequestError as error:
            await send_json(send, 400, error_body("invalid_request_error", error.message))
            return
        await send_json(send, 200, page)

    async def _stats(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        snapshot = self.stats.snapshot()
        snapshot["billed_calls"] = len(self.state.usage.records)
        await send_json(send, 200, snapshot)

    async def _get_config(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.config.to_json())

    async def _patch_config(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            patch_config(self.config, request.json())
        except (SimRequestError, ValueError) as error:
            message = error.message if isinstance(error, SimRequestError) else "Expected a JSON body."
            await reply(self.state, send, 400, error_body("invalid_request_error", message))
            return
        self.state.cache.min_tokens = self.config.min_cache_tokens
        await send_json(send, 200, self.config.to_json())

    async def _reset(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        self.state.reset()
        await send_json(send, 200, {"reset": True})

    async def _usage(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"data": [dataclasses.asdict(r) for r in self.state.usage.records]})

    async def _inject(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        try:
            record = injected_usage(request.json(), self.state.new_id("req_"), time.time())
        except (SimRequestError, ValueError) as error:
            message = error.message if isinstance(error, SimRequestError) else "Expected a JSON body."
            await send_json(send, 400, error_body("invalid_request_error", message))
            return
        self.state.usage.add(record)
        await send_json(send, 200, dataclasses.asdict(record))


def create_anthropic_app(config: AnthropicSimConfig | None = None, usage_journal: Path | None = None) -> AnthropicSimulator:
    """`usage_journal`: a file that keeps the usage and cost reports across restarts (UsageLedger)."""
    return AnthropicSimulator(config or AnthropicSimConfig(), usage_journal)
