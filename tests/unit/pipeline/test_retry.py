"""The retry module on an upstream that does not know the model: one attempt, no
failover, no mark against the upstream, and an error naming the client's model."""

from __future__ import annotations

import asyncio
import random
import time
from typing import cast

import orjson
import pytest

from gateway.errors import GatewayError, ModelNotFound
from gateway.pipeline.retry import Retrier
from gateway.request_context import RequestContext
from gateway.routing.policy import Retry
from gateway.routing.resolved import ModelTarget, RuntimePolicy
from gateway.upstreams.health import UpstreamHealth
from gateway.upstreams.translate import error_from_reply

NOT_FOUND = orjson.dumps({"error": {"message": "The model `gpt-4o-mini-2024-07-18` does not exist or you do not have access to it.",
                                    "type": "invalid_request_error", "param": None, "code": "model_not_found"}})
SERVER_ERROR = orjson.dumps({"error": {"message": "The server had an error", "type": "server_error"}})


def target(name: str, upstream: str, upstream_model: str) -> ModelTarget:
    return ModelTarget(name=name, upstream=upstream, upstream_kind="openai", upstream_model=upstream_model, price=None,
                       tokenizer="o200k_base", max_output_tokens=64)


def call(status: int, body: bytes) -> tuple[GatewayError, list[str], UpstreamHealth]:
    """Send a request asking for `auto` (a route) to two targets whose upstream answers
    `status`; returns the error, the upstreams tried in order, and their health."""
    health = UpstreamHealth()
    retrier = Retrier(health, random.Random(0))
    ctx = RequestContext(request_id="req_1", endpoint="chat.completions", path="/chat/completions",
                         policy=cast(RuntimePolicy, None), requested_model="auto", deadline=time.monotonic() + 30)
    targets = [target("small", "hosted", "gpt-4o-mini-2024-07-18"), target("fallback", "backup", "gpt-4o")]
    tried: list[str] = []

    async def send(t: ModelTarget) -> None:
        tried.append(t.upstream)
        raise error_from_reply(t.upstream, status, {}, body)

    # Quick retries: only the first attempts and the failover matter here.
    config = Retry(max_attempts=2, base_s=0.001, cap_s=0.001, cooldown_after=1, cooldown_s=60)
    with pytest.raises(GatewayError) as raised:
        asyncio.run(retrier.call(ctx, targets, config, send))
    return raised.value, tried, health


def test_an_upstream_404_for_the_model_is_tried_once_and_names_the_clients_model() -> None:
    error, tried, health = call(404, NOT_FOUND)
    assert tried == ["hosted"], "neither retried nor failed over"
    assert isinstance(error, ModelNotFound) and error.http_status == 404
    assert error.body()["error"] == {"message": error.message, "type": "invalid_request_error", "param": "model",
                                     "code": "model_not_found"}
    assert "`auto`" in error.message and "2024-07-18" not in error.message
    assert error.response_headers()["x-should-retry"] == "false"
    assert asyncio.run(health.cooldown_left("hosted")) == 0, "a wrong name is not the upstream's failure"


def test_a_server_error_by_contrast_is_retried_failed_over_and_cools_the_upstream() -> None:
    error, tried, health = call(500, SERVER_ERROR)
    assert tried == ["hosted", "hosted", "backup", "backup"]
    assert error.response_headers()["x-should-retry"] == "true"
    assert asyncio.run(health.cooldown_left("hosted")) > 0
