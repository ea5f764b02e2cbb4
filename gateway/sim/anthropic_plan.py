"""What the simulated Claude answers: a Messages request -> validated fields and a plan
of content blocks (thinking, text or a tool call), decided up front from the seed and
the request so latency, streaming and faults wrap it without changing what is said.
Text comes from the same generator as the other simulators."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.sim.generation import SimRequestError
from gateway.sim.jsongen import generate_json
from gateway.sim.textgen import _cut_pieces, generate_words, seeded_rng, stable_digest
from gateway.tokens.counting import get_encoding

ROLES = ("user", "assistant")
# With this beta (Claude Code sends it) a conversation may carry system turns too.
MID_CONVERSATION_SYSTEM = "mid-conversation-system"
THINKING_TOKENS = 12  # words of "thinking" before the answer, within budget_tokens


@dataclass(frozen=True, slots=True)
class BlockPlan:
    type: str  # "thinking" | "text" | "tool_use"
    pieces: list[str]  # one per output token (tool_use: fragments of the input's JSON)
    tool_id: str = ""
    tool_name: str = ""
    tool_input: Any = None
    signature: str = ""

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def as_content(self) -> dict[str, Any]:
        if self.type == "thinking":
            return {"type": "thinking", "thinking": self.text, "signature": self.signature}
        if self.type == "tool_use":
            return {"type": "tool_use", "id": self.tool_id, "name": self.tool_name, "input": self.tool_input}
        return {"type": "text", "text": self.text}


@dataclass(frozen=True, slots=True)
class MessagePlan:
    blocks: list[BlockPlan]
    stop_reason: str  # end_turn | max_tokens | stop_sequence | tool_use
    stop_sequence: str | None

    @property
    def output_tokens(self) -> int:
        return sum(len(b.pieces) for b in self.blocks)


def _require_int(body: Mapping[str, Any], name: str, minimum: int) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SimRequestError(f"{name}: Field required" if value is None else f"{name}: Input should be a valid integer", name)
    if value < minimum:
        raise SimRequestError(f"{name}: Input should be greater than or equal to {minimum}", name)
    return value


def validate(body: Mapping[str, Any], betas: str = "") -> None:
    """The checks Anthropic makes before anything runs; raises SimRequestError.
    `betas`: the request's `anthropic-beta` header."""
    roles = (*ROLES, "system") if MID_CONVERSATION_SYSTEM in betas else ROLES
    max_tokens = _require_int(body, "max_tokens", 1)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise SimRequestError("messages: Field required", "messages")
    if not messages:
        raise SimRequestError("messages: at least one message is required", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in roles:
            raise SimRequestError(f"messages.{i}.role: Input should be 'user' or 'assistant'", "messages")
        if "content" not in message:
            raise SimRequestError(f"messages.{i}.content: Field required", "messages")
    stops = body.get("stop_sequences")
    if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
        raise SimRequestError("stop_sequences: Input should be a valid list of strings", "stop_sequences")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise SimRequestError("tools: Input should be a valid list", "tools")
        for i, tool in enumerate(tools):
            if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
                raise SimRequestError(f"tools.{i}.name: Field required", "tools")
            if "type" not in tool and not isinstance(tool.get("input_schema"), Mapping):
                raise SimRequestError(f"tools.{i}.input_schema: Field required", "tools")
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, Mapping) else None
        if kind == "enabled":
            budget = _require_int(thinking, "budget_tokens", 1024)
            if budget >= max_tokens:
                raise SimRequestError("`max_tokens` must be greater than `thinking.budget_tokens`", "thinking")
        elif kind not in ("disabled", "adaptive"):
            raise SimRequestError("thinking.type: Input should be 'enabled', 'disabled' or 'adaptive'", "thinking")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise SimRequestError("metadata: Input should be a valid dictionary", "metadata")
    if body.get("stream") is not None and not isinstance(body.get("stream"), bool):
        raise SimRequestError("stream: Input should be a valid boolean", "stream")


def _chosen_tool(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    tools: list[Mapping[str, Any]] = [t for t in body.get("tools") or [] if isinstance(t.get("input_schema"), Mapping)]
    choice = body.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if not tools or kind == "none":
        return None
    if kind == "tool":
        for tool in tools:
            if tool["name"] == choice.get("name"):
                return tool
        raise SimRequestError(f"tool_choice: tool {choice.get('name')!r} not found in tools", "tool_choice")
    if kind == "any":
        return tools[0]
    last = body["messages"][-1]
    content = last.get("content")
    answered = isinstance(content, list) and any(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)
    return None if answered else tools[0]  # auto: call a tool unless this turn brings its result


def _token_pieces(text: str, bound: int, encoding: str) -> tuple[list[str], bool]:
    enc = get_encoding(encoding)
    tokens = enc.encode_ordinary(text)
    return [enc.decode([t]) for t in tokens[:bound]], len(tokens) > bound


def _words_until_stop(rng: random.Random, count: int, stops: Sequence[str]) -> tuple[list[str], str | None]:
    """`count` words, cut at the first stop sequence (which is named): like a real model,
    the word completing it is generated and billed, but the stop text is not returned."""
    words = generate_words(rng, count, "stop").pieces
    text = ""
    for i, word in enumerate(words):
        text += word
        found = [(pos, s) for s in stops if (pos := text.find(s)) >= 0]
        if found:
            pos, stop = min(found)
            return _cut_pieces(words[: i + 1], pos), stop
    return words, None


def plan_message(body: Mapping[str, Any], seed: int, default_tokens: int, encoding: str) -> MessagePlan:
    bound: int = body["max_tokens"]
    rng = seeded_rng(seed, stable_digest(body.get("system"), body["messages"]).hex(), body.get("temperature"))
    blocks: list[BlockPlan] = []
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive"):
        words = generate_words(rng, min(THINKING_TOKENS, bound), "stop")
        blocks.append(BlockPlan("thinking", words.pieces, signature="sig_" + rng.randbytes(24).hex()))
        bound -= len(words.pieces)
    tool = _chosen_tool(body)
    if tool is not None:
        args = orjson.dumps(generate_json(tool["input_schema"], rng)).decode()
        pieces, truncated = _token_pieces(args, bound, encoding)
        tool_id = "toolu_" + rng.randbytes(12).hex()
        blocks.append(BlockPlan("tool_use", pieces, tool_id, str(tool["name"]), orjson.loads(args) if not truncated else {}))
        return MessagePlan(blocks, "max_tokens" if truncated else "tool_use", None)
    if bound <= 0:
        return MessagePlan(blocks, "max_tokens", None)
    stops = [s for s in body.get("stop_sequences") or [] if s]
    pieces, stop = _words_until_stop(rng, min(default_tokens, bound), stops)
    if stop is not None:
        return MessagePlan([*blocks, BlockPlan("text", pieces)], "stop_sequence", stop)
    return MessagePlan([*blocks, BlockPlan("text", pieces)], "end_turn" if default_tokens <= bound else "max_tokens", None)
