"""`kind: anthropic`: Anthropic's Messages API behind the gateway's OpenAI-shaped path.

It goes out on the same aiohttp session, bounds and deadlines as every HTTP upstream
(upstreams/http.py); what differs is the address (`{base_url}/v1/messages`, base_url
as in the anthropic SDK), the credentials (`x-api-key` from `api_key_env`, and
`anthropic-version`) and the dialect: OpenAI chat calls are translated in
upstreams/anthropic_translate.py, streamed ones re-told event by event
(upstreams/anthropic_stream_to_chat.py), while the Messages API's own paths
(`/messages`, `/messages/count_tokens`, which clients reach through the gateway's
`/v1/messages`) pass through as they are, streamed or not."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, TypeVar

import orjson

from gateway.errors import InvalidRequest
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.anthropic_stream_to_chat import AnthropicToChatChunks
from gateway.upstreams.anthropic_translate import chat_to_messages, error_to_openai, message_to_chat
from gateway.upstreams.base import PoolRequest, UpstreamReply, UpstreamStream
from gateway.upstreams.http import HttpUpstream
from gateway.upstreams.translated_stream import TranslatedStream

ANTHROPIC_VERSION = "2023-06-01"
MESSAGES_PATH = "/v1/messages"
Answer = TypeVar("Answer", UpstreamReply, UpstreamStream)
# The gateway's own paths for the Messages API, passed through untranslated.
NATIVE_PATHS = ("/messages", "/messages/count_tokens")


class AnthropicUpstream(HttpUpstream):
    def __init__(self, name: str, config: UpstreamConfig) -> None:
        super().__init__(name, config)
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        self._headers = {"content-type": "application/json", "accept-encoding": "identity",
                         "anthropic-version": ANTHROPIC_VERSION}
        if key:
            self._headers["x-api-key"] = key

    async def send(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None, *,
                   headers: Mapping[str, str] | None = None) -> UpstreamReply:
        if path in NATIVE_PATHS:
            return _with_request_id(await super().send("/v1" + path, body, timeout_s, headers=headers))
        _, payload = self._as_messages(path, body)
        reply = await super().send(MESSAGES_PATH, payload, timeout_s)
        if reply.status != 200:
            return UpstreamReply(reply.status, reply.headers, error_to_openai(reply.status, reply.body), reply.replica)
        # With the provider's request id, for the ledger and reconciliation.
        return _with_request_id(reply).translated(lambda message: message_to_chat(message, int(time.time())))

    async def open_stream(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None, *,
                          headers: Mapping[str, str] | None = None) -> UpstreamStream:
        if path in NATIVE_PATHS:
            return _with_request_id(await super().open_stream("/v1" + path, body, timeout_s, headers=headers))
        request, payload = self._as_messages(path, body)
        stream = _with_request_id(await super().open_stream(MESSAGES_PATH, payload, timeout_s))
        options = request.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return TranslatedStream(stream, AnthropicToChatChunks(int(time.time()), include_usage),
                                error_body=lambda raw: error_to_openai(stream.status, raw))

    def _as_messages(self, path: str, body: bytes) -> tuple[dict[str, Any], bytes]:
        """A chat completions request (parsed) and its Messages API body."""
        if path != "/chat/completions":
            raise InvalidRequest(f"upstream `{self.name}` (kind: anthropic) serves chat completions only")
        request = orjson.loads(body)
        return request, orjson.dumps(chat_to_messages(request, str(request.get("model"))))


def _with_request_id(answer: Answer) -> Answer:
    """Anthropic names its request id `request-id`; the ledger reads `x-request-id`."""
    answer.headers.setdefault("x-request-id", answer.headers.get("request-id", ""))
    return answer
