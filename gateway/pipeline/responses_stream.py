"""A streamed chat completion, event for event, as the Responses API streams:
`response.created`, `response.in_progress`, then per output item `output_item.added`,
its content part or function-call argument events, `output_item.done`, and at the end
`response.completed` (or `response.incomplete`, or `response.failed` when the chat
stream carried an error). The finished Response is handed to `on_complete` (the
store) before the last event goes out, so a client that has the last event can
retrieve it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.pipeline.responses_translate import function_call_item, message_item, new_id, response_object, usage_of
from gateway.upstreams.sse import named_event


@dataclass(slots=True)
class _Item:
    id: str
    index: int
    kind: str  # message | function_call
    text: str = ""  # the message's text, or the call's arguments
    call_id: str = ""
    name: str = ""
    done: bool = False

    def final(self) -> dict[str, Any]:
        if self.kind == "message":
            return message_item(self.text, self.id)
        return function_call_item(self.call_id, self.name, self.text, self.id)


@dataclass
class ResponseStreamTranslator:
    response_id: str
    body: Mapping[str, Any]
    model: str
    on_complete: Callable[[dict[str, Any]], Awaitable[None]]
    sequence: int = 0
    items: list[_Item] = field(default_factory=list)
    calls: dict[int, _Item] = field(default_factory=dict)  # by the chat tool call's index
    text_item: _Item | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    created_at: int = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return named_event(kind, payload)

    def _snapshot(self, status: str | None, output: list[dict[str, Any]]) -> dict[str, Any]:
        response = response_object(self.response_id, self.body, model=self.model, output=output, finish_reason=self.finish_reason,
                                   usage=usage_of(self.usage), status=status, created_at=self.created_at or None)
        self.created_at = response["created_at"]
        return response

    def start(self) -> bytes:
        snapshot = self._snapshot("in_progress", [])
        return self._event("response.created", response=snapshot) + self._event("response.in_progress", response=snapshot)

    def feed(self, chunk: bytes) -> bytes:
        out = []
        for event in chunk.split(b"\n\n"):
            for line in event.split(b"\n"):
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    out.append(self._chat_chunk(orjson.loads(line[5:])))
        return b"".join(out)

    def _chat_chunk(self, chunk: dict[str, Any]) -> bytes:
        if chunk.get("error"):
            self.error = chunk["error"]
            return b""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        out = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out.append(self._text(delta["content"]))
            for call in delta.get("tool_calls") or []:
                out.append(self._call(call))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _open(self, item: _Item, added: dict[str, Any]) -> bytes:
        closing = b"".join(self._close(i) for i in self.items if not i.done)
        self.items.append(item)
        return closing + self._event("response.output_item.added", output_index=item.index, item=added)

    def _text(self, delta: str) -> bytes:
        out = b""
        item = self.text_item
        if item is None or item.done:
            item = self.text_item = _Item(new_id("msg"), len(self.items), "message")
            out += self._open(item, {**message_item("", item.id, "in_progress"), "content": []})
            out += self._event("response.content_part.added", item_id=item.id, output_index=item.index, content_index=0,
                               part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        item.text += delta
        return out + self._event("response.output_text.delta", item_id=item.id, output_index=item.index, content_index=0,
                                 delta=delta, logprobs=[])

    def _call(self, call: dict[str, Any]) -> bytes:
        out = b""
        function = call.get("function") or {}
        item = self.calls.get(int(call.get("index", 0)))
        if item is None:
            item = _Item(new_id("fc"), len(self.items), "function_call", call_id=str(call.get("id") or new_id("call")),
                         name=str(function.get("name") or ""))
            self.calls[int(call.get("index", 0))] = item
            out += self._open(item, function_call_item(item.call_id, item.name, "", item.id, "in_progress"))
        arguments = function.get("arguments")
        if arguments:
            item.text += arguments
            out += self._event("response.function_call_arguments.delta", item_id=item.id, output_index=item.index, delta=arguments)
        return out

    def _close(self, item: _Item) -> bytes:
        item.done = True
        final = item.final()
        if item.kind == "message":
            part = final["content"][0]
            out = self._event("response.output_text.done", item_id=item.id, output_index=item.index, content_index=0,
                              text=item.text, logprobs=[])
            out += self._event("response.content_part.done", item_id=item.id, output_index=item.index, content_index=0, part=part)
        else:
            out = self._event("response.function_call_arguments.done", item_id=item.id, output_index=item.index,
                              name=item.name, arguments=item.text)
        return out + self._event("response.output_item.done", output_index=item.index, item=final)

    async def finish(self) -> bytes:
        if self.error is not None:
            return self._failed(self.error)
        if self.finish_reason is None:
            return self._failed({"message": "the upstream stream ended before the answer was complete", "code": "upstream_stream_cut"})
        closing = b"".join(self._close(i) for i in self.items if not i.done)
        output = [i.final() for i in self.items] or [message_item("")]
        response = self._snapshot(None, output)
        try:
            await self.on_complete(response)
        except GatewayError as exc:
            return closing + self._failed({"message": exc.message, "code": exc.code or "server_error"})
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return closing + self._event(kind, response=response)

    def _failed(self, error: dict[str, Any]) -> bytes:
        output = [i.final() for i in self.items]
        response = {**self._snapshot("failed", output),
                    "error": {"code": str(error.get("code") or "server_error"), "message": str(error.get("message") or "")}}
        return self._event("response.failed", response=response)


async def translated(chat: AsyncIterator[bytes], translator: ResponseStreamTranslator) -> AsyncIterator[bytes]:
    """The chat stream's events as Responses events. The first upstream chunk is read
    before anything is sent, so a failure before it is still an error with its own
    status (api/hot_paths.stream waits for the first chunk to send the head)."""
    try:
        first = await anext(chat, b"")
        yield translator.start() + translator.feed(first)
        async for chunk in chat:
            out = translator.feed(chunk)
            if out:
                yield out
        yield await translator.finish()
    finally:
        aclose = getattr(chat, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
