"""What a simulated model answers: request fields -> one plan per choice.

Both simulators share this: `n`, `stop`, `max_tokens`/`max_completion_tokens`,
`min_tokens`, `ignore_eos`, `seed`, `response_format` and tools. Output is decided up
front (deterministic from the server seed and the request), which lets the servers
apply latency, streaming and faults around it without changing what is said.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.sim.jsongen import generate_json
from gateway.sim.textgen import generate_words, seeded_rng, stable_digest
from gateway.tokens.counting import get_encoding

MAX_N = 128


class SimRequestError(Exception):
    """A request the real server would reject; each simulator renders its own error shape."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


@dataclass(frozen=True)
class ToolCallPlan:
    id: str
    name: str


@dataclass(frozen=True)
class ChoicePlan:
    """One choice: its streamed pieces (one per completion token) and finish reason."""

    index: int
    pieces: list[str]
    finish_reason: str
    tool_call: ToolCallPlan | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)


@dataclass(frozen=True)
class GenerationSettings:
    seed: int
    default_tokens: int
    encoding: str = "o200k_base"


def int_field(body: Mapping[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SimRequestError(f"Invalid '{name}': expected an integer >= {minimum}, got {value!r}.", name)
    return value


def output_bound(body: Mapping[str, Any]) -> int | None:
    """The completion-token bound; `max_completion_tokens` wins over deprecated `max_tokens`."""
    bound = int_field(body, "max_completion_tokens", 1)
    return bound if bound is not None else int_field(body, "max_tokens", 1)


def _stop_sequences(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise SimRequestError("Invalid 'stop': expected a string or an array of strings.", "stop")


def _choice_count(body: Mapping[str, Any]) -> int:
    n = int_field(body, "n", 1)
    if n is not None and n > MAX_N:
        raise SimRequestError(f"Invalid 'n': at most {MAX_N}.", "n")
    return n or 1


def _length(body: Mapping[str, Any], settings: GenerationSettings) -> tuple[int, str]:
    """How many tokens to generate, and the finish reason if nothing stops it earlier."""
    bound = output_bound(body)
    natural = max(settings.default_tokens, int_field(body, "min_tokens", 0) or 0)
    if bound is None:
        return natural, "stop"
    if body.get("ignore_eos") is True or natural >= bound:
        return bound, "length"
    return natural, "stop"


def _token_pieces(text: str, bound: int | None, encoding: str) -> tuple[list[str], bool]:
    """Split text into one piece per token; True if the bound truncated it."""
    enc = get_encoding(encoding)
    tokens = enc.encode_ordinary(text)
    truncated = bound is not None and len(tokens) > bound
    if truncated:
        tokens = tokens[:bound]
    return [enc.decode([t]) for t in tokens], truncated


def _json_schema(body: Mapping[str, Any]) -> tuple[bool, Mapping[str, Any] | None]:
    """(wants JSON, schema or None) from `response_format`."""
    fmt = body.get("response_format")
    if fmt is None:
        return False, None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return False, None
    if kind == "json_object":
        return True, None
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping):
            raise SimRequestError("Missing required parameter: 'response_format.json_schema'.", "response_format")
        return True, spec.get("schema") or {"type": "object"}
    raise SimRequestError(f"Invalid 'response_format.type': {kind!r}.", "response_format")


def _chosen_tool(body: Mapping[str, Any], messages: Sequence[Any]) -> Mapping[str, Any] | None:
    """The tool's `function` object to call, or None for a text answer."""
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise SimRequestError("Invalid 'tools': expected an array.", "tools")
    functions: list[Mapping[str, Any]] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise SimRequestError("Missing required parameter: 'tools[].function.name'.", "tools")
        functions.append(fn)
    choice = body.get("tool_choice")
    if choice == "none":
        return None
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name")
        for fn in functions:
            if fn["name"] == name:
                return fn
        raise SimRequestError(f"Tool choice 'function' with name {name!r} not found in 'tools'.", "tool_choice")
    last = messages[-1] if messages else None
    if isinstance(last, Mapping) and last.get("role") == "tool":
        return None
    return functions[0]


def _chat_choice(
    index: int, rng: random.Random, body: Mapping[str, Any], tool: Mapping[str, Any] | None, settings: GenerationSettings
) -> ChoicePlan:
    count, natural_finish = _length(body, settings)
    bound = output_bound(body)
    if tool is not None:
        params = tool.get("parameters")
        args = orjson.dumps(generate_json(params if isinstance(params, Mapping) else {"type": "object"}, rng))
        pieces, truncated = _token_pieces(args.decode(), bound, settings.encoding)
        call = ToolCallPlan(id="call_" + rng.randbytes(12).hex(), name=str(tool["name"]))
        return ChoicePlan(index, pieces, "length" if truncated else "tool_calls", call)
    wants_json, schema = _json_schema(body)
    if wants_json:
        text = orjson.dumps(generate_json(schema, rng)).decode()
        pieces, truncated = _token_pieces(text, bound, settings.encoding)
        return ChoicePlan(index, pieces, "length" if truncated else "stop")
    words = generate_words(rng, count, natural_finish, _stop_sequences(body))
    return ChoicePlan(index, words.pieces, words.finish_reason)


def plan_chat(body: Mapping[str, Any], settings: GenerationSettings) -> list[ChoicePlan]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SimRequestError("Missing required parameter: 'messages'.", "messages")
    if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in messages):
        raise SimRequestError("Invalid 'messages': every message needs a 'role'.", "messages")
    n = _choice_count(body)
    tool = _chosen_tool(body, messages)
    digest = stable_digest(messages).hex()
    request_seed = body.get("seed")
    return [_chat_choice(i, seeded_rng(settings.seed, digest, request_seed, i), body, tool, settings) for i in range(n)]


def completion_prompts(body: Mapping[str, Any]) -> list[str | list[int]]:
    """`prompt` as a list of prompts: a string, strings, a token array or token arrays."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [list(prompt)]
        if all(isinstance(p, str) or (isinstance(p, list) and all(isinstance(t, int) for t in p)) for p in prompt):
            return list(prompt)
    raise SimRequestError("Missing or invalid parameter: 'prompt'.", "prompt")


def plan_completion(
    body: Mapping[str, Any], prompts: Sequence[str | list[int]], settings: GenerationSettings
) -> list[ChoicePlan]:
    n = _choice_count(body)
    count, natural_finish = _length(body, settings)
    stop = _stop_sequences(body)
    plans: list[ChoicePlan] = []
    for p_index, prompt in enumerate(prompts):
        digest = stable_digest(prompt).hex()
        for j in range(n):
            rng = seeded_rng(settings.seed, digest, body.get("seed"), j)
            words = generate_words(rng, count, natural_finish, stop)
            plans.append(ChoicePlan(p_index * n + j, words.pieces, words.finish_reason))
    return plans
