"""An upstream stream re-told in another dialect as it arrives: complete events in,
the translator's events out. A reply that is not a 200 is the upstream's error, for
the error path to read: whole, through `error_body` when its dialect differs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol

from gateway.upstreams.base import UpstreamStream
from gateway.upstreams.sse import EventBuffer

MAX_ERROR_BYTES = 64 * 1024  # as much of an error body as is read to report it


class EventTranslator(Protocol):
    def feed(self, events: bytes) -> bytes:
        """Complete server-sent events in; the events they translate to out (maybe none)."""
        ...


class TranslatedStream:
    def __init__(self, inner: UpstreamStream, translator: EventTranslator,
                 error_body: Callable[[bytes], bytes] | None = None) -> None:
        self.inner = inner
        self.translator = translator
        self.error_body = error_body
        self.status, self.headers, self.replica = inner.status, inner.headers, inner.replica
        self.max_event_bytes = inner.max_event_bytes

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self.status != 200:
            raw = b""
            async for chunk in self.inner.aiter_raw():
                raw += chunk
                if len(raw) > MAX_ERROR_BYTES:
                    break
            yield self.error_body(raw) if self.error_body is not None else raw
            return
        events = EventBuffer(self.max_event_bytes)
        async for chunk in self.inner.aiter_raw():
            complete = events.complete(chunk)
            if complete:
                out = self.translator.feed(complete)
                if out:
                    yield out

    async def aclose(self) -> None:
        await self.inner.aclose()
