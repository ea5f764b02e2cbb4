"""Server-sent event relay: forwards upstream events as they complete, untouched, while
noting the first token, the finish reason and the final usage chunk.

Only events that can carry usage are parsed; content chunks pass through as bytes.
One event is bounded (`max_event_bytes`): an upstream that never ends an event cannot
make the gateway buffer without end.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import UpstreamReplyTooLarge
from gateway.upstreams.redaction import redact

DONE = b"data: [DONE]"
TAIL_EVENTS = 3
DEFAULT_MAX_EVENT_BYTES = 1024 * 1024


class EventBuffer:
    """Cuts a byte stream into complete server-sent events, keeping the unfinished rest,
    which may not grow past `max_event_bytes`."""

    __slots__ = ("_buffer", "max_event_bytes")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._buffer = b""

    def complete(self, chunk: bytes) -> bytes:
        """The events `chunk` completes (with what was buffered), each ending in a blank line."""
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        data = self._buffer + chunk if self._buffer else chunk
        end = data.rfind(b"\n\n")
        self._buffer = self._bounded(data if end < 0 else data[end + 2 :])
        return b"" if end < 0 else data[: end + 2]

    def _bounded(self, unfinished: bytes) -> bytes:
        if len(unfinished) > self.max_event_bytes:
            raise UpstreamReplyTooLarge(f"the upstream sent a streamed event over the gateway's bound of {self.max_event_bytes} bytes")
        return unfinished

    def leftover(self) -> bytes:
        return self._buffer


class SseRelay:
    __slots__ = ("_events", "done", "error", "events", "finish_reason", "model", "secrets", "strip_usage_chunk", "usage")

    def __init__(self, strip_usage_chunk: bool, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
                 secrets: tuple[str, ...] = ()) -> None:
        self.strip_usage_chunk = strip_usage_chunk
        self._events = EventBuffer(max_event_bytes)
        self.secrets = secrets  # scrubbed, with URLs and hosts, from an error event's message
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.done = False
        self.events = 0
        self.error: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> bytes:
        """Return the complete events in `chunk` (plus what was buffered) to forward now."""
        complete = self._events.complete(chunk)
        if not complete:
            return b""
        if _plain_content(complete):
            cut = len(complete)
        else:
            # A read holding a whole stream (as under load): a stream ends with its finish,
            # usage and [DONE] events, so when what comes before them is plain content,
            # only they are parsed.
            cut = _tail_start(complete, TAIL_EVENTS)
            if cut and not _plain_content(complete[:cut]):
                cut = 0
        plain, rest = complete[:cut], complete[cut:]
        self.events += plain.count(b"\n\n")
        if not rest:
            return plain
        return plain + b"".join(self._inspect(e) for e in rest.split(b"\n\n") if e)

    def _inspect(self, event: bytes) -> bytes:
        self.events += 1
        if event.startswith(DONE):
            self.done = True
            return event + b"\n\n"
        if not event.startswith(b"data:"):
            return event + b"\n\n"
        try:
            payload = orjson.loads(event[5:])
        except orjson.JSONDecodeError:
            return event + b"\n\n"
        if not isinstance(payload, dict):
            return event + b"\n\n"
        if "error" in payload:
            error = payload["error"] if isinstance(payload["error"], dict) else {"message": str(payload["error"])}
            error["message"] = redact(str(error.get("message", "")), self.secrets)
            self.error = payload["error"] = error
            return data_event(payload)
        self.model = payload.get("model") or self.model
        for choice in payload.get("choices") or ():
            if isinstance(choice, dict) and choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            if self.strip_usage_chunk and not payload.get("choices"):
                return b""
        return event + b"\n\n"

    def leftover(self) -> bytes:
        return self._events.leftover()


def data_event(payload: Any) -> bytes:
    """A server-sent event carrying `payload` as JSON, unnamed (as OpenAI sends them)."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def named_event(name: str, payload: Any) -> bytes:
    """A named server-sent event carrying `payload` as JSON (Anthropic's, the Responses API's)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def event_data(event: bytes) -> dict[str, Any] | None:
    """The JSON object in an event's `data:` line, or None (no such line, not JSON, not an object)."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            try:
                payload = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return None
            return payload if isinstance(payload, dict) else None
    return None


def _tail_start(events: bytes, count: int) -> int:
    """Where the last `count` events of `events` (which ends with a blank line) begin."""
    at = len(events) - 2
    for _ in range(count):
        at = events.rfind(b"\n\n", 0, at)
        if at < 0:
            return 0
    return at + 2


def _plain_content(events: bytes) -> bool:
    """True when no event here can carry usage, a finish reason, an error or the end.

    With `include_usage`, OpenAI (and vLLM) put `"usage":null` in every chunk: that is
    no usage, and must not send each content chunk through the JSON parser. Quotes
    inside content are escaped (`\\"usage\\"`), so they never match these patterns."""
    if b"[DONE]" in events or b'"error"' in events:
        return False
    return _all_null(events, b'"usage"') and _all_null(events, b'"finish_reason"')


def _all_null(events: bytes, key: bytes) -> bool:
    """Every `key` in `events` has the value null (compact JSON, or with a space)."""
    total = events.count(key)
    if not total:
        return True
    compact = events.count(key + b":null")  # what OpenAI and vLLM write: the spaced form is counted only if needed
    return compact == total or compact + events.count(key + b": null") == total
