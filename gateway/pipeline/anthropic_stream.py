"""Anthropic's streamed Messages events, relayed as they complete and untouched, while
noting what the books need: the input and cache usage from `message_start`, the output
from `message_delta`, the end at `message_stop`, and an `error` event (its message
scrubbed of credentials and addresses, as every relayed upstream message is).

The same surface as upstreams/sse.py's SseRelay, which pipeline/forward.py drives:
`feed`, `done`, `error`, `usage` (in OpenAI's shape, as the books read it)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.upstreams.anthropic_translate import usage_to_openai
from gateway.upstreams.redaction import redact
from gateway.upstreams.sse import DEFAULT_MAX_EVENT_BYTES, EventBuffer, event_data, named_event

# Only these events carry what the books need; deltas and pings pass as bytes.
WATCHED = (b"message_start", b"message_delta", b"message_stop", b"error")
NAMED_WATCHED = tuple(b"event: " + name + b"\n" for name in WATCHED)


class AnthropicEventRelay:
    __slots__ = ("_events", "_start_usage", "done", "error", "events", "secrets", "usage")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES, secrets: tuple[str, ...] = ()) -> None:
        self._events = EventBuffer(max_event_bytes)
        self.secrets = secrets
        self.usage: dict[str, Any] | None = None  # set once `message_delta` gives the output
        self.done = False
        self.error: dict[str, Any] | None = None
        self.events = 0
        self._start_usage: dict[str, Any] = {}

    def feed(self, chunk: bytes) -> bytes:
        """The complete events in `chunk` (plus what was buffered), to forward now."""
        complete = self._events.complete(chunk)
        if not complete:
            return b""
        if not any(name in complete for name in WATCHED):
            self.events += complete.count(b"\n\n")
            return complete
        return b"".join(self._inspect(e) for e in complete.split(b"\n\n") if e)

    def _inspect(self, event: bytes) -> bytes:
        self.events += 1
        if event.startswith(b"event: ") and not event.startswith(NAMED_WATCHED):
            return event + b"\n\n"  # named, and not one the books read: no need to parse it
        payload = event_data(event)
        kind = payload.get("type") if payload is not None else None
        if payload is None or kind not in ("message_start", "message_delta", "message_stop", "error"):
            return event + b"\n\n"
        if kind == "message_start":
            message = payload.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self._start_usage = usage if isinstance(usage, dict) else {}
        elif kind == "message_delta":
            delta_usage = payload.get("usage")
            if isinstance(delta_usage, dict):
                # The delta's counts are cumulative: they win over the start's (output above all).
                self.usage = usage_to_openai({**self._start_usage, **{k: v for k, v in delta_usage.items() if v is not None}})
        elif kind == "message_stop":
            self.done = True
        else:
            found = payload.get("error")
            error: dict[str, Any] = found if isinstance(found, dict) else {"message": str(found)}
            error["message"] = redact(str(error.get("message", "")), self.secrets)
            self.error = payload["error"] = error
            return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"
        return event + b"\n\n"


def error_event(message: str, kind: str = "api_error") -> bytes:
    """An `error` event as Anthropic sends one mid-stream: the anthropic SDK raises on
    it, so a cut stream is noticed instead of looking like a short answer."""
    return named_event("error", {"type": "error", "error": {"type": kind, "message": message}})
