"""What is particular to Anthropic's Messages API on the gateway's request path
(`POST /v1/messages` and `/v1/messages/count_tokens`): which of the client's headers go
on, which models may answer, and the body sent upstream. The stages themselves - auth,
admission, holds, retries, books - are the runner's, as for every endpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.routing.resolved import ModelTarget
from gateway.types.usage import Usage
from gateway.upstreams.anthropic_translate import usage_to_openai

MESSAGES, COUNT_TOKENS = "messages", "messages.count_tokens"
ENDPOINTS = (MESSAGES, COUNT_TOKENS)
# The protocol's own headers: the version the client speaks and the betas it opts into.
PASSED_HEADERS = ("anthropic-version", "anthropic-beta")
NATIVE_KIND = "anthropic"


def passed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in PASSED_HEADERS if headers.get(name)}


def native_targets(requested_model: str, targets: list[ModelTarget]) -> list[ModelTarget]:
    """The targets that speak the Messages API; a model (or route) with none is refused
    rather than sent a body its upstream does not read."""
    native = [t for t in targets if t.upstream_kind == NATIVE_KIND]
    if not native:
        raise InvalidRequest(f"model: `{requested_model}` is not served over the Messages API "
                             "(its upstream is not `kind: anthropic`); call it at /v1/chat/completions", param="model")
    return native


def upstream_body(body: Mapping[str, Any], target: ModelTarget) -> bytes:
    """The client's body as it came, but for the model's name upstream: tools, images,
    `cache_control`, `metadata`, `thinking`, `system` and the rest pass untouched."""
    return orjson.dumps({**body, "model": target.upstream_model})


def usage_of(usage: Mapping[str, Any]) -> Usage:
    """Anthropic's usage as the books take it: prompt = input + cache reads + cache
    writes, cached = cache reads, cache_write = cache writes."""
    return Usage.from_openai(usage_to_openai(usage))
