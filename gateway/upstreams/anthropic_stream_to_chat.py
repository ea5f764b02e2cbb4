"""Anthropic's streamed Messages events, re-told as OpenAI `chat.completion.chunk`
events for a chat client of a `kind: anthropic` upstream: the role first (at
`message_start`), text and tool-call argument deltas as they come, the finish reason
(from `message_delta`'s stop reason), then - when the request asked for
`stream_options.include_usage` - a last chunk with the whole usage (the input and cache
counts from `message_start`, the output from `message_delta`), and `[DONE]` at
`message_stop`. An `error` event becomes a chunk carrying `error`, as OpenAI sends one.
Thinking blocks have no chat equivalent and are left out."""

from __future__ import annotations

from typing import Any

from gateway.upstreams.anthropic_translate import STOP_TO_FINISH, usage_to_openai
from gateway.upstreams.sse import data_event, event_data

DONE = b"data: [DONE]\n\n"


class AnthropicToChatChunks:
    """Feed it complete Anthropic events; it returns the chat chunks they make."""

    def __init__(self, created: int, include_usage: bool) -> None:
        self.created = created
        self.include_usage = include_usage
        self.id = "chatcmpl-"
        self.model: Any = None
        self.usage: dict[str, Any] = {}
        self.calls: dict[int, int] = {}  # content block index -> chat tool call index

    def feed(self, events: bytes) -> bytes:
        return b"".join(self._event(payload) for raw in events.split(b"\n\n") if raw and (payload := event_data(raw)) is not None)

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return self._event_of([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}])

    def _event_of(self, choices: list[dict[str, Any]], **more: Any) -> bytes:
        return data_event({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                           "choices": choices, **more})

    def _event(self, payload: dict[str, Any]) -> bytes:
        kind = payload.get("type")
        if kind == "message_start":
            message = payload.get("message") or {}
            self.id = "chatcmpl-" + str(message.get("id", "")).removeprefix("msg_")
            self.model = message.get("model")
            self.usage = dict(message.get("usage") or {})
            return self._chunk({"role": "assistant", "content": ""})
        if kind == "content_block_start":
            return self._block_start(int(payload.get("index") or 0), payload.get("content_block") or {})
        if kind == "content_block_delta":
            return self._delta(int(payload.get("index") or 0), payload.get("delta") or {})
        if kind == "message_delta":
            # The delta's counts are cumulative: they win over the start's (output above all).
            self.usage.update({k: v for k, v in (payload.get("usage") or {}).items() if v is not None})
            stop = (payload.get("delta") or {}).get("stop_reason")
            return self._chunk({}, STOP_TO_FINISH.get(str(stop), "stop"))
        if kind == "message_stop":
            return self._usage_chunk() + DONE
        if kind == "error":
            error = payload.get("error") or {}
            body = {"error": {"message": str(error.get("message", "")), "type": str(error.get("type", "api_error")),
                              "param": None, "code": None}}
            return data_event(body)
        return b""  # ping, content_block_stop

    def _block_start(self, index: int, block: dict[str, Any]) -> bytes:
        if block.get("type") != "tool_use":
            return b""
        position = self.calls[index] = len(self.calls)
        call = {"index": position, "id": block.get("id"), "type": "function",
                "function": {"name": block.get("name"), "arguments": ""}}
        return self._chunk({"tool_calls": [call]})

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        if delta.get("type") == "text_delta":
            return self._chunk({"content": str(delta.get("text", ""))})
        if delta.get("type") == "input_json_delta" and index in self.calls:
            call = {"index": self.calls[index], "function": {"arguments": str(delta.get("partial_json", ""))}}
            return self._chunk({"tool_calls": [call]})
        return b""  # thinking and signature deltas

    def _usage_chunk(self) -> bytes:
        if not self.include_usage:
            return b""
        return self._event_of([], usage=usage_to_openai(self.usage))
