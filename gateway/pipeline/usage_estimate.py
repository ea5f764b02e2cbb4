"""What an attempt whose usage the provider never reported (a stream the client
cancelled, one cut or timed out, a call the client left) most likely cost: its prompt,
counted, plus the output already relayed to the client, counted from the relayed text.
Booked as `estimated`; reconciliation against the provider's report corrects it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from gateway.tokens.counting import Tokenizers
from gateway.tokens.prompt_size import PromptSize
from gateway.types.usage import Usage


def relayed_text(events: Iterable[bytes]) -> str:
    """The generated text in relayed SSE events: content, reasoning, tool-call
    arguments (chat), text (completions), and Anthropic's content block deltas."""
    parts: list[str] = []
    for event in b"".join(events).split(b"\n\n"):
        at = event.find(b"data:")  # Anthropic's events open with an `event:` line
        if at < 0 or event.startswith(b"data: [DONE]"):
            continue
        try:
            payload = orjson.loads(event[at + 5 :])
        except orjson.JSONDecodeError:
            continue
        if isinstance(payload, dict):
            if payload.get("type") == "content_block_delta" and isinstance(payload.get("delta"), dict):
                delta = payload["delta"]
                parts.extend(delta[k] for k in ("text", "thinking", "partial_json") if isinstance(delta.get(k), str))
            for choice in payload.get("choices") or ():
                if isinstance(choice, dict):
                    parts.extend(_choice_text(choice))
    return "".join(parts)


def _choice_text(choice: dict[str, Any]) -> Iterable[str]:
    if isinstance(choice.get("text"), str):
        yield choice["text"]
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return
    for key in ("content", "reasoning_content", "reasoning"):
        if isinstance(delta.get(key), str):
            yield delta[key]
    for call in delta.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            yield from (function[k] for k in ("name", "arguments") if isinstance(function.get(k), str))


async def estimate_usage(prompt: PromptSize, tokenizers: Tokenizers, relayed: str) -> Usage:
    prompt_tokens = await prompt.count()
    completion = 0
    if relayed:
        encoder = await tokenizers.get(prompt.encoding)
        completion = len(encoder.encode_ordinary(relayed))
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion)
