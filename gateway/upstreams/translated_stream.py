"""An upstream stream re-told in another dialect as it arrives: complete events in,
the translator's events out. A reply that is not a 200 passes untouched, for the
error path to read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from gateway.upstreams.base import UpstreamStream
from gateway.upstreams.sse import EventBuffer


class EventTranslator(Protocol):
    def feed(self, events: bytes) -> bytes:
        """Complete server-sent events in; the events they translate to out (maybe none)."""
        ...


class TranslatedStream:
    def __init__(self, inner: UpstreamStream, translator: EventTranslator) -> None:
        self.inner = inner
        self.translator = translator
        self.status, self.headers, self.replica = inner.status, inner.headers, inner.replica
        self.max_event_bytes = inner.max_event_bytes

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self.status != 200:
            async for chunk in self.inner.aiter_raw():
                yield chunk
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
