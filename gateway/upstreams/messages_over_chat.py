"""An OpenAI-kind or vLLM upstream answering the Messages API: the pipeline sends it a
chat completions body (translated in upstreams/messages_to_chat.py, then prepared as
every chat call is: tenant steering, output bound, usage in the stream), and this view
of the upstream sends it to `/chat/completions` and re-tells the answer - whole or
streamed - as a Messages answer, which the pipeline books and relays as it does a
native one. Errors pass untouched: the pipeline renders them in Anthropic's shape."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.upstreams.base import PoolRequest, Upstream, UpstreamReply
from gateway.upstreams.chat_stream_to_messages import ChatToMessagesEvents
from gateway.upstreams.messages_to_chat import chat_to_message
from gateway.upstreams.translated_stream import TranslatedStream

CHAT_PATH = "/chat/completions"


class MessagesOverChat:
    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.name, self.kind, self.secrets = upstream.name, upstream.kind, upstream.secrets

    async def send(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None) -> UpstreamReply:
        reply = await self.upstream.send(CHAT_PATH, body, timeout_s, pool)
        return reply.translated(chat_to_message) if reply.status == 200 else reply

    async def open_stream(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None) -> TranslatedStream:
        stream = await self.upstream.open_stream(CHAT_PATH, body, timeout_s, pool)
        return TranslatedStream(stream, ChatToMessagesEvents())

    def with_headers(self, headers: Mapping[str, str]) -> MessagesOverChat:
        return MessagesOverChat(self.upstream.with_headers(headers))

    async def aclose(self) -> None:
        """The connections are the upstream's: closing this view closes nothing."""
