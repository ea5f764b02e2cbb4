"""Convert between a streamed answer (SSE events) and the plain completion object.

The response cache stores one form, the plain `chat.completion` / `text_completion`
body, and serves both: a streamed answer is rebuilt into a completion before it is
stored, and a stored completion is replayed as the events an OpenAI client expects when
it asked for `stream: true`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from gateway.upstreams.sse import data_event

DONE_EVENT = b"data: [DONE]\n\n"
_HEADER_FIELDS = ("id", "created", "model", "system_fingerprint", "service_tier")
_CHOICE_FIELDS = frozenset({"index", "delta", "message", "text", "logprobs", "finish_reason"})
_WORDS = re.compile(r"\S+\s*|\s+")  # every character lands in exactly one piece
_ARGUMENT_PIECE_CHARS = 64


class _Unusable(Exception):
    """The stream cannot be turned into a completion (an error event, bad JSON)."""


# -- stream -> completion ----------------------------------------------------------


def completion_from_stream(events: Iterable[bytes]) -> dict[str, Any] | None:
    """The completion a streamed answer amounts to, or None when the stream is not a
    whole answer: no `[DONE]`, a choice without a finish reason, an error event.

    Each item holds one or more complete events (`data: {...}\\n\\n`), so both single
    events and the batches the SSE relay forwards can be fed in.
    """
    merger = _StreamMerger()
    done = False
    try:
        for payload in _payloads(events):
            if payload is None:
                done = True
            else:
                merger.add(payload)
    except _Unusable:
        return None
    return merger.result() if done else None


def _payloads(events: Iterable[bytes]) -> Iterator[dict[str, Any] | None]:
    """Each event's JSON object, or None for `[DONE]`; comments and other fields skipped."""
    for item in events:
        for event in item.replace(b"\r\n", b"\n").split(b"\n\n"):
            data = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if not data:
                continue
            raw = b"\n".join(data)
            if raw.strip() == b"[DONE]":
                yield None
                continue
            try:
                payload = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise _Unusable from None
            if not isinstance(payload, dict) or "error" in payload:
                raise _Unusable
            yield payload


class _ChoiceMerger:
    __slots__ = ("extras", "finish_reason", "function_call", "logprobs", "message", "text", "tool_calls")

    def __init__(self) -> None:
        self.message: dict[str, Any] = {"role": "assistant", "content": None}
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.function_call: dict[str, str] | None = None
        self.text: str | None = None
        self.logprobs: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.extras: dict[str, Any] = {}

    def add(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._add_delta(delta)
        text = choice.get("text")
        if isinstance(text, str):
            self.text = (self.text or "") + text
        self._add_logprobs(choice.get("logprobs"))
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        for name, value in choice.items():
            if name not in _CHOICE_FIELDS and (value is not None or name not in self.extras):
                self.extras[name] = value

    def _add_delta(self, delta: dict[str, Any]) -> None:
        message = self.message
        for name, value in delta.items():
            if name == "tool_calls":
                for piece in value or ():
                    self._add_tool_call(piece)
            elif name == "function_call":
                self._add_function_call(value)
            elif name == "role":
                message["role"] = value or message["role"]
            elif isinstance(value, str) and isinstance(message.get(name), str):
                message[name] += value  # content, refusal, reasoning_content, ...
            elif value is not None or name not in message:
                message[name] = value

    def _add_tool_call(self, piece: Any) -> None:
        if not isinstance(piece, dict):
            raise _Unusable
        index = piece.get("index")
        call = self.tool_calls.setdefault(index if isinstance(index, int) else 0,
                                          {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        call["id"] = piece.get("id") or call["id"]
        call["type"] = piece.get("type") or call["type"]
        function = piece.get("function")
        if isinstance(function, dict):
            # The name arrives whole in one delta; only the arguments are split.
            call["function"]["name"] = call["function"]["name"] or function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""

    def _add_function_call(self, piece: Any) -> None:
        if not isinstance(piece, dict):
            return
        if self.function_call is None:
            self.function_call = {"name": "", "arguments": ""}
        self.function_call["name"] = self.function_call["name"] or piece.get("name") or ""
        self.function_call["arguments"] += piece.get("arguments") or ""

    def _add_logprobs(self, piece: Any) -> None:
        if not isinstance(piece, dict):
            return
        merged = self.logprobs if self.logprobs is not None else {}
        for name, value in piece.items():
            if isinstance(value, list):
                merged.setdefault(name, []).extend(value)
            elif value is not None or name not in merged:
                merged[name] = value
        self.logprobs = merged

    def chat_choice(self, index: int) -> dict[str, Any]:
        message = dict(self.message)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        if self.function_call is not None:
            message["function_call"] = self.function_call
        return {"index": index, "message": message, "logprobs": self.logprobs, "finish_reason": self.finish_reason, **self.extras}

    def text_choice(self, index: int) -> dict[str, Any]:
        return {"index": index, "text": self.text or "", "logprobs": self.logprobs, "finish_reason": self.finish_reason, **self.extras}


class _StreamMerger:
    def __init__(self) -> None:
        self.header: dict[str, Any] = {}
        self.choices: dict[int, _ChoiceMerger] = {}
        self.usage: dict[str, Any] | None = None
        self.is_chat: bool | None = None

    def add(self, payload: dict[str, Any]) -> None:
        for name in _HEADER_FIELDS:
            if name in payload and (payload[name] is not None or name not in self.header):
                self.header[name] = payload[name]
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        for choice in payload.get("choices") or ():
            if not isinstance(choice, dict) or not isinstance(choice.get("index", 0), int):
                raise _Unusable
            is_chat = "delta" in choice
            if self.is_chat is not None and is_chat != self.is_chat:
                raise _Unusable  # chat and text chunks mixed: not one answer
            self.is_chat = is_chat
            index = choice.get("index", 0)
            merger = self.choices.get(index)
            if merger is None:  # not `setdefault`: that would build a merger for every chunk, to drop it
                merger = self.choices[index] = _ChoiceMerger()
            merger.add(choice)

    def result(self) -> dict[str, Any] | None:
        if not self.choices or any(c.finish_reason is None for c in self.choices.values()):
            return None
        body = _with_object(self.header, "chat.completion" if self.is_chat else "text_completion")
        if self.is_chat:
            body["choices"] = [self.choices[i].chat_choice(i) for i in sorted(self.choices)]
        else:
            body["choices"] = [self.choices[i].text_choice(i) for i in sorted(self.choices)]
        if self.usage is not None:
            body["usage"] = self.usage
        return body


# -- completion -> stream ----------------------------------------------------------


def stream_from_completion(body: dict[str, Any], include_usage: bool) -> list[bytes]:
    """The SSE events an OpenAI client would receive for `body`, ending in `[DONE]`.

    Content is split at word boundaries (the pieces join back to the exact text) so a
    replayed answer streams like a live one. A choice that carries logprobs sends its
    content in one piece instead, so each chunk's logprobs still match its text.
    """
    is_chat = body.get("object") == "chat.completion" or any(isinstance(c, dict) and "message" in c for c in body.get("choices") or ())
    header = _with_object({name: body[name] for name in _HEADER_FIELDS if name in body},
                          "chat.completion.chunk" if is_chat else "text_completion")
    if include_usage:
        header["usage"] = None  # as OpenAI does: null on every chunk but the last
    chunks: list[dict[str, Any]] = []
    for choice in body.get("choices") or ():
        pieces = _chat_choice_chunks(choice) if is_chat else _text_choice_chunks(choice)
        chunks.extend({**header, "choices": [piece]} for piece in pieces)
    usage = body.get("usage")
    if include_usage and usage is not None:
        chunks.append({**header, "choices": [], "usage": usage})
    return [data_event(chunk) for chunk in chunks] + [DONE_EVENT]


def _with_object(header: dict[str, Any], name: str) -> dict[str, Any]:
    """`header` with `object` after `id`, the order OpenAI's bodies use."""
    ordered: dict[str, Any] = {"id": header["id"]} if "id" in header else {}
    ordered["object"] = name
    ordered.update(header)
    return ordered


def _words(text: str) -> list[str]:
    return _WORDS.findall(text)


def _extras(choice: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in choice.items() if name not in _CHOICE_FIELDS}


def _chat_choice_chunks(choice: dict[str, Any]) -> Iterator[dict[str, Any]]:
    index = choice.get("index", 0)
    message: dict[str, Any] = choice.get("message") or {}
    logprobs = choice.get("logprobs")

    def chunk(delta: dict[str, Any], finish: Any = None, lp: Any = None) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}

    content = message.get("content")
    first: dict[str, Any] = {"role": message.get("role", "assistant"), "content": "" if isinstance(content, str) else content}
    streamed: list[tuple[str, str]] = []  # (field, text) sent in pieces after the role chunk
    for name, value in message.items():
        if name in ("role", "content", "tool_calls", "function_call"):
            continue
        if isinstance(value, str) and value:
            first[name] = ""
            streamed.append((name, value))
        else:
            first[name] = value
    yield chunk(first)
    for name, text in streamed:
        for piece in _words(text):
            yield chunk({name: piece})
    if isinstance(content, str) and (content or logprobs is not None):
        pieces = [content] if logprobs is not None else _words(content)
        for i, piece in enumerate(pieces):
            yield chunk({"content": piece}, lp=logprobs if i == 0 else None)
    for position, call in enumerate(message.get("tool_calls") or ()):
        yield from (chunk({"tool_calls": [delta]}) for delta in _tool_call_deltas(position, call))
    if message.get("function_call") is not None:
        yield chunk({"function_call": message["function_call"]})
    # With no text to carry them (a tool call), logprobs ride on the finish chunk.
    unsent = logprobs if not isinstance(content, str) else None
    yield {**chunk({}, choice.get("finish_reason"), unsent), **_extras(choice)}


def _tool_call_deltas(position: int, call: dict[str, Any]) -> Iterator[dict[str, Any]]:
    function = call.get("function") or {}
    arguments = function.get("arguments") or ""
    head = {"index": position, "id": call.get("id"), "type": call.get("type", "function"),
            "function": {"name": function.get("name", ""), "arguments": ""}}
    yield head
    for start in range(0, len(arguments), _ARGUMENT_PIECE_CHARS):
        yield {"index": position, "function": {"arguments": arguments[start:start + _ARGUMENT_PIECE_CHARS]}}


def _text_choice_chunks(choice: dict[str, Any]) -> Iterator[dict[str, Any]]:
    index = choice.get("index", 0)
    text = choice.get("text") or ""
    logprobs = choice.get("logprobs")
    pieces = [text] if logprobs is not None else _words(text)
    for i, piece in enumerate(pieces):
        yield {"index": index, "text": piece, "logprobs": logprobs if i == 0 else None, "finish_reason": None}
    yield {"index": index, "text": "", "logprobs": None, "finish_reason": choice.get("finish_reason"), **_extras(choice)}
