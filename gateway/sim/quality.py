"""Quality profiles: which prompts a simulated model gets wrong, how, and the truth.

A profile gives a model two rates. Whether a prompt is one the model gets wrong is
decided by a hash of (seed, model, messages) - not a random draw - so the same prompt
always gets the same outcome, and draws for different models are independent (a
prompt hard for a small model is usually easy for a large one).

- check_fail: the answer fails a check `gateway.verify` can make. How depends on what
  the request asked for: JSON -> cut-off JSON text (invalid_json) or a required field
  dropped (schema_mismatch); a tool call -> arguments that are not JSON or lack a
  required parameter (invalid_tool_call); text -> cut off with finish_reason "length"
  (truncated) or no content (empty).
- silent_wrong: a different, well-formed answer that passes every check.

Only the simulator knows which is which: it keeps each chat response's truth by the
response `id` (which reaches a gateway's client unchanged), served at
`GET /sim/truth/{id}`. Benchmarks read it; the gateway never does.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import orjson

from gateway.sim.generation import ChoicePlan, GenerationSettings, plan_chat
from gateway.sim.textgen import stable_digest
from gateway.tokens.counting import get_encoding

MAX_TRUTHS = 100_000  # responses remembered; a benchmark reads each one right after it


class QualityProfile(NamedTuple):
    """Share of distinct prompts a model answers checkably wrong / silently wrong."""

    check_fail_rate: float
    silent_wrong_rate: float


class Outcome(StrEnum):
    CORRECT = "correct"
    CHECK_FAIL = "check_fail"
    SILENT_WRONG = "silent_wrong"


@dataclass(frozen=True)
class Truth:
    """What the simulator knows about one answer; `signal` is the verify check it fails."""

    outcome: Outcome
    signal: str | None = None
    detail: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"outcome": str(self.outcome), "signal": self.signal, "detail": self.detail}


CORRECT = Truth(Outcome.CORRECT)


def parse_profile(text: str) -> tuple[str, QualityProfile]:
    """`MODEL=CHECK_FAIL_RATE,SILENT_WRONG_RATE` (the CLI flag) -> (model, profile)."""
    model, sep, rates = text.rpartition("=")
    parts = rates.split(",")
    if not sep or not model or len(parts) != 2:
        raise ValueError(f"expected MODEL=CHECK_FAIL_RATE,SILENT_WRONG_RATE, got {text!r}")
    try:
        profile = QualityProfile(float(parts[0]), float(parts[1]))
    except ValueError:
        raise ValueError(f"rates must be numbers, got {rates!r}") from None
    return model, validate_profile(profile)


def validate_profile(profile: QualityProfile) -> QualityProfile:
    fail, silent = profile
    if not (0.0 <= fail <= 1.0 and 0.0 <= silent <= 1.0 and fail + silent <= 1.0):
        raise ValueError(f"rates must be within [0, 1] and sum to at most 1, got {fail}, {silent}")
    return profile


@dataclass(frozen=True)
class Draw:
    """The prompt's fixed draws for one model: where it falls in [0, 1), and a failure pick."""

    position: float
    pick: int

    @classmethod
    def of(cls, seed: int, model: str, messages: Any) -> Draw:
        digest = stable_digest("quality", seed, model, messages)
        return cls(int.from_bytes(digest[:8], "big") / 2**64, int.from_bytes(digest[8:12], "big"))

    def outcome(self, profile: QualityProfile) -> Outcome:
        if self.position < profile.check_fail_rate:
            return Outcome.CHECK_FAIL
        if self.position < profile.check_fail_rate + profile.silent_wrong_rate:
            return Outcome.SILENT_WRONG
        return Outcome.CORRECT


def plan_chat_with_quality(
    body: Mapping[str, Any], settings: GenerationSettings, model: str, profile: QualityProfile | None
) -> tuple[list[ChoicePlan], Truth]:
    """`plan_chat`, then the profile's verdict on this prompt applied to every choice."""
    plans = plan_chat(body, settings)
    if profile is None:
        return plans, _as_delivered(plans)
    draw = Draw.of(settings.seed, model, body["messages"])
    outcome = draw.outcome(profile)
    if outcome is Outcome.SILENT_WRONG:
        # Another seed gives another answer of the same form: well-formed, and wrong.
        wrong_seed = int.from_bytes(stable_digest("silent-wrong", settings.seed)[:4], "big")
        plans = plan_chat(body, dataclasses.replace(settings, seed=wrong_seed))
        return plans, Truth(Outcome.SILENT_WRONG)
    if outcome is Outcome.CHECK_FAIL:
        return _spoil(plans, body, draw.pick, settings.encoding)
    return plans, _as_delivered(plans)


def _as_delivered(plans: Sequence[ChoicePlan]) -> Truth:
    """A right answer the request's own token bound cut off is not a usable answer."""
    if any(p.finish_reason == "length" for p in plans):
        return Truth(Outcome.CHECK_FAIL, "truncated", "cut off by the request's token bound")
    return CORRECT


def _spoil(plans: list[ChoicePlan], body: Mapping[str, Any], pick: int, encoding: str) -> tuple[list[ChoicePlan], Truth]:
    first = plans[0]
    if first.tool_call is not None:
        params = _tool_parameters(body, first.tool_call.name)
        return _spoil_json(plans, _required(params), pick, encoding, "invalid_tool_call", "invalid_tool_call")
    schema = _response_schema(body)
    if schema is not None:
        return _spoil_json(plans, _required(schema), pick, encoding, "invalid_json", "schema_mismatch")
    if pick % 2 == 0:
        cut = [dataclasses.replace(p, pieces=p.pieces[: max(1, len(p.pieces) // 2)], finish_reason="length") for p in plans]
        return cut, Truth(Outcome.CHECK_FAIL, "truncated", "cut off half-way")
    empty = [dataclasses.replace(p, pieces=[], finish_reason="stop") for p in plans]
    return empty, Truth(Outcome.CHECK_FAIL, "empty", "no content")


def _spoil_json(
    plans: list[ChoicePlan], required: list[str], pick: int, encoding: str, bad_text_signal: str, dropped_signal: str
) -> tuple[list[ChoicePlan], Truth]:
    """Cut-off JSON text, or (when the schema requires fields) one required field dropped."""
    if required and pick % 2 == 1:
        name = required[(pick // 2) % len(required)]
        dropped = [_drop_field(p, name, encoding) for p in plans]
        if all(p is not None for p in dropped):
            return [p for p in dropped if p is not None], Truth(Outcome.CHECK_FAIL, dropped_signal, f"dropped required {name!r}")
    return [_cut_json(p) for p in plans], Truth(Outcome.CHECK_FAIL, bad_text_signal, "cut-off JSON text")


def _cut_json(plan: ChoicePlan) -> ChoicePlan:
    pieces = plan.pieces[: len(plan.pieces) // 2]
    if _parses("".join(pieces)):  # a prefix of a bare number can still be JSON
        pieces = [*pieces, ","]
    return dataclasses.replace(plan, pieces=pieces)


def _drop_field(plan: ChoicePlan, name: str, encoding: str) -> ChoicePlan | None:
    try:
        value = orjson.loads(plan.text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict) or name not in value:
        return None
    del value[name]
    enc = get_encoding(encoding)
    pieces = [enc.decode([t]) for t in enc.encode_ordinary(orjson.dumps(value).decode())]
    return dataclasses.replace(plan, pieces=pieces)


def _parses(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def _tool_parameters(body: Mapping[str, Any], name: str) -> Any:
    for tool in body.get("tools") or ():
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and fn.get("name") == name:
            return fn.get("parameters")
    return None


def _response_schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The schema a JSON answer must follow ({} for json_object mode); None for text."""
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "json_object":
        return {}
    if kind == "json_schema" and isinstance(fmt, Mapping):
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        return schema if isinstance(schema, Mapping) else {}
    return None


def _required(schema: Any) -> list[str]:
    required = schema.get("required") if isinstance(schema, Mapping) else None
    return [r for r in required if isinstance(r, str)] if isinstance(required, list) else []


class TruthLog:
    """Response id -> (model, truth), bounded: the oldest entries go first."""

    def __init__(self, capacity: int = MAX_TRUTHS) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, tuple[str, Truth]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, response_id: str, model: str, truth: Truth) -> None:
        self._entries[response_id] = (model, truth)
        if len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def lookup(self, response_id: str) -> dict[str, Any] | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        model, truth = entry
        return {"id": response_id, "model": model, **truth.to_json()}

    def clear(self) -> None:
        self._entries.clear()
