"""A streamed chat completion, re-told as Anthropic's Messages events, in the order the
API sends them: `message_start`, per content block `content_block_start` (the first
followed by a `ping`), its `content_block_delta`s (`text_delta`, or `input_json_delta`
for a tool call's arguments) and `content_block_stop`, then `message_delta` with the
stop reason and usage, and `message_stop`.

A chat stream names its usage only in its last chunk, so `message_start` carries none
and `message_delta` carries all of it (input and cache counts included: the anthropic
SDK takes them from there). An error chunk becomes an `error` event; a stream that
ends without `[DONE]` ends without `message_stop`, which the relay reports as cut."""

from __future__ import annotations

from typing import Any

from gateway.upstreams.messages_to_chat import stop_reason, usage_to_anthropic
from gateway.upstreams.sse import event_data, named_event

EMPTY_USAGE = {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0}


class ChatToMessagesEvents:
    """Feed it complete chat SSE events; it returns the Anthropic events they make."""

    def __init__(self) -> None:
        self.started = False
        self.index = -1  # the open content block's index, -1 before the first
        self.open_kind: str | None = None  # "text" | "tool_use" while a block is open
        self.calls: dict[int, int] = {}  # chat tool call index -> content block index
        self.finish_reason: Any = None
        self.usage: dict[str, Any] | None = None
        self.ended = False

    def feed(self, events: bytes) -> bytes:
        out: list[bytes] = []
        for raw in events.split(b"\n\n"):
            chunk = event_data(raw)
            if chunk is not None:
                out.append(self._chunk(chunk))
            elif raw.strip().removeprefix(b"data:").strip() == b"[DONE]":
                out.append(self._end())
        return b"".join(out)

    def _chunk(self, chunk: dict[str, Any]) -> bytes:
        if isinstance(chunk.get("error"), dict):
            error = chunk["error"]
            return named_event("error", {"type": "error", "error": {"type": "api_error", "message": str(error.get("message", ""))}})
        out = [self._start(chunk)] if not self.started else []
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out.append(self._text(str(delta["content"])))
            for call in delta.get("tool_calls") or []:
                out.append(self._tool_call(call))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self.started = True
        message: dict[str, Any] = {"id": "msg_" + str(chunk.get("id", "")).removeprefix("chatcmpl-"), "type": "message", "role": "assistant",
                   "model": chunk.get("model"), "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": dict(EMPTY_USAGE)}
        return named_event("message_start", {"type": "message_start", "message": message})

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self.index += 1
        self.open_kind = kind
        out += named_event("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})
        if self.index == 0:
            out += named_event("ping", {"type": "ping"})
        return out

    def _close(self) -> bytes:
        if self.open_kind is None:
            return b""
        self.open_kind = None
        return named_event("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _text(self, text: str) -> bytes:
        out = self._open("text", {"type": "text", "text": ""}) if self.open_kind != "text" else b""
        delta = {"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": text}}
        return out + named_event("content_block_delta", delta)

    def _tool_call(self, call: dict[str, Any]) -> bytes:
        position = int(call.get("index") or 0)
        function = call.get("function") or {}
        out = b""
        if position not in self.calls:
            block = {"type": "tool_use", "id": str(call.get("id", "")), "name": str(function.get("name", "")), "input": {}}
            out = self._open("tool_use", block)
            self.calls[position] = self.index
        arguments = function.get("arguments")
        if arguments:
            delta = {"type": "content_block_delta", "index": self.calls[position],
                     "delta": {"type": "input_json_delta", "partial_json": str(arguments)}}
            out += named_event("content_block_delta", delta)
        return out

    def _end(self) -> bytes:
        if self.ended or not self.started:
            return b""
        self.ended = True
        usage = usage_to_anthropic(self.usage)
        delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason(self.finish_reason), "stop_sequence": None},
                 "usage": usage}
        return self._close() + named_event("message_delta", delta) + named_event("message_stop", {"type": "message_stop"})
