"""What is particular to Anthropic's Messages API on the gateway's request path
(`POST /v1/messages` and `/v1/messages/count_tokens`): which of the client's headers go
on, and the body sent upstream - the client's own to a `kind: anthropic` upstream, a
translated chat completions body to any other (answered through
upstreams/messages_over_chat.py). The stages themselves - auth, admission, holds,
retries, failover across kinds, books - are the runner's, as for every endpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.caching.breakpoints import add_messages_breakpoint
from gateway.routing.resolved import ModelTarget
from gateway.types.usage import Usage
from gateway.upstreams.anthropic_translate import usage_to_openai
from gateway.upstreams.base import Upstream
from gateway.upstreams.messages_over_chat import MessagesOverChat
from gateway.upstreams.messages_to_chat import request_to_chat

MESSAGES, COUNT_TOKENS = "messages", "messages.count_tokens"
ENDPOINTS = (MESSAGES, COUNT_TOKENS)
# The protocol's own headers: the version the client speaks and the betas it opts into.
PASSED_HEADERS = ("anthropic-version", "anthropic-beta")
NATIVE_KIND = "anthropic"


def passed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in PASSED_HEADERS if headers.get(name)}


def speaks_messages(target: ModelTarget) -> bool:
    return target.upstream_kind == NATIVE_KIND


def upstream_for(upstream: Upstream, target: ModelTarget, headers: Mapping[str, str]) -> Upstream:
    """The target's upstream as the Messages API reaches it: with the client's protocol
    headers when it speaks the API, through a translating view of it otherwise."""
    if not speaks_messages(target):
        return MessagesOverChat(upstream)
    return upstream.with_headers(headers) if headers else upstream


def chat_body(body: Mapping[str, Any], target: ModelTarget) -> dict[str, Any]:
    """The Messages request as a chat completions request, for a target that does not
    speak the Messages API; the runner then prepares it as any chat call."""
    return request_to_chat(body, target.upstream_model)


def native_body(body: Mapping[str, Any], target: ModelTarget, add_breakpoint: bool = False) -> bytes:
    """The client's body as it came, but for the model's name upstream: tools, images,
    `cache_control`, `metadata`, `thinking`, `system` and the rest pass untouched -
    unless the model adds a cache breakpoint where the client marked none."""
    out = {**body, "model": target.upstream_model}
    if add_breakpoint:
        add_messages_breakpoint(out)
    return orjson.dumps(out)


def usage_of(usage: Mapping[str, Any]) -> Usage:
    """Anthropic's usage as the books take it: prompt = input + cache reads + cache
    writes, cached = cache reads, cache_write = cache writes."""
    return Usage.from_openai(usage_to_openai(usage))
