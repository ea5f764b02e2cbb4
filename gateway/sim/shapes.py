"""OpenAI-shaped response bodies and stream chunks built from choice plans.

The hosted API and vLLM emit the same structure with small differences in extra
fields (vLLM adds `stop_reason`, hosted adds `refusal`/`annotations`); a `Dialect`
carries those so the shape itself is written once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.sim.generation import ChoicePlan


@dataclass(frozen=True)
class Dialect:
    message_extras: Mapping[str, Any] = field(default_factory=dict)
    choice_extras: Mapping[str, Any] = field(default_factory=dict)
    first_delta_extras: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamStep:
    """One SSE chunk, the completion tokens it carries and its decode position (-1: none)."""

    chunk: dict[str, Any]
    tokens: int
    position: int = -1


def _tool_calls(plan: ChoicePlan) -> list[dict[str, Any]]:
    assert plan.tool_call is not None
    call = plan.tool_call
    return [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": plan.text}}]


def chat_completion(
    header: Mapping[str, Any], plans: Sequence[ChoicePlan], usage: Mapping[str, Any], dialect: Dialect
) -> dict[str, Any]:
    choices = []
    for plan in plans:
        message: dict[str, Any] = {"role": "assistant", "content": None if plan.tool_call else plan.text}
        message.update(dialect.message_extras)
        if plan.tool_call is not None:
            message["tool_calls"] = _tool_calls(plan)
        choice = {"index": plan.index, "message": message, "logprobs": None, "finish_reason": plan.finish_reason}
        choice.update(dialect.choice_extras)
        choices.append(choice)
    return {**header, "object": "chat.completion", "choices": choices, "usage": usage}


def _chunk(header: Mapping[str, Any], index: int, delta: dict[str, Any], finish: str | None, dialect: Dialect) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice.update(dialect.choice_extras)
    return {**header, "object": "chat.completion.chunk", "choices": [choice]}


def _first_delta(plan: ChoicePlan, dialect: Dialect) -> dict[str, Any]:
    if plan.tool_call is None:
        return {"role": "assistant", "content": "", **dialect.first_delta_extras}
    call = plan.tool_call
    head = {"index": 0, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
    return {"role": "assistant", "content": None, "tool_calls": [head], **dialect.first_delta_extras}


def _piece_delta(plan: ChoicePlan, piece: str) -> dict[str, Any]:
    if plan.tool_call is None:
        return {"content": piece}
    return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}


def chat_stream_steps(header: Mapping[str, Any], plans: Sequence[ChoicePlan], dialect: Dialect) -> Iterator[StreamStep]:
    """Role chunk per choice, one chunk per token (choices interleaved), finish chunks."""
    for plan in plans:
        yield StreamStep(_chunk(header, plan.index, _first_delta(plan, dialect), None, dialect), 0)
    longest = max((p.completion_tokens for p in plans), default=0)
    for position in range(longest):
        for plan in plans:
            if position < plan.completion_tokens:
                delta = _piece_delta(plan, plan.pieces[position])
                yield StreamStep(_chunk(header, plan.index, delta, None, dialect), 1, position)
    for plan in plans:
        yield StreamStep(_chunk(header, plan.index, {}, plan.finish_reason, dialect), 0)


def text_completion(
    header: Mapping[str, Any], plans: Sequence[ChoicePlan], usage: Mapping[str, Any], dialect: Dialect
) -> dict[str, Any]:
    choices = []
    for plan in plans:
        choice = {"index": plan.index, "text": plan.text, "logprobs": None, "finish_reason": plan.finish_reason}
        choice.update(dialect.choice_extras)
        choices.append(choice)
    return {**header, "object": "text_completion", "choices": choices, "usage": usage}


def completion_stream_steps(
    header: Mapping[str, Any], plans: Sequence[ChoicePlan], dialect: Dialect
) -> Iterator[StreamStep]:
    def chunk(plan: ChoicePlan, text: str, finish: str | None) -> dict[str, Any]:
        choice = {"index": plan.index, "text": text, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice.update(dialect.choice_extras)
        return {**header, "object": "text_completion", "choices": [choice]}

    longest = max((p.completion_tokens for p in plans), default=0)
    for position in range(longest):
        for plan in plans:
            if position < plan.completion_tokens:
                yield StreamStep(chunk(plan, plan.pieces[position], None), 1, position)
    for plan in plans:
        yield StreamStep(chunk(plan, "", plan.finish_reason), 0)


def usage_chunk(header: Mapping[str, Any], object_name: str, usage: Mapping[str, Any]) -> dict[str, Any]:
    """The final chunk `stream_options.include_usage` asks for: no choices, just usage."""
    return {**header, "object": object_name, "choices": [], "usage": usage}
