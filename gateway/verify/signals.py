"""Verifiable signals on a chat completion: the only grounds a route escalates on.

A cheap model's answer moves up the chain when it fails something the gateway can
check itself - JSON that does not parse or match the requested schema, required fields
left empty, a cut-off answer, an unusable tool call, nothing at all, or a signal the
client computed (retrieval coverage, a validator's verdict) - never the model's own
claim of confidence.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.verify.tool_calls import has_tool_calls, tool_call_problems

SIGNALS = frozenset({
    "invalid_json", "schema_mismatch", "missing_fields", "truncated", "invalid_tool_call", "empty", "client_signal",
})
JSON_SIGNALS = frozenset({"invalid_json", "schema_mismatch", "missing_fields"})
REQUEST_LEVEL = -1  # Failure.choice of a client signal: it is about the request, not one choice
DETAIL_CHARS = 80
MAX_VALIDATORS = 256  # distinct schemas kept compiled; routes reuse a handful


@dataclass(frozen=True, slots=True)
class Failure:
    signal: str  # one of SIGNALS
    detail: str  # short and human; quotes at most ~80 characters of model output
    choice: int  # the failing choice's index, or REQUEST_LEVEL


@dataclass(frozen=True, slots=True)
class Check:
    """One configured signal; invalid combinations fail here, when the policy loads."""

    signal: str
    fields: tuple[str, ...] = ()  # missing_fields: dotted paths, "name", "address.city", "items.0.sku"
    header: str | None = None  # client_signal: the request header to read
    below: float | None = None  # client_signal fails when float(header) < below
    equals: str | None = None  # ... or when the header equals this (case-insensitive)

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"unknown signal {self.signal!r}; expected one of {', '.join(sorted(SIGNALS))}")
        object.__setattr__(self, "fields", tuple(self.fields))
        if self.signal == "missing_fields":
            if not self.fields or any(not part for path in self.fields for part in path.split(".")):
                raise ValueError("missing_fields needs dotted field paths, e.g. ['name', 'address.city']")
        elif self.fields:
            raise ValueError(f"`fields` is only for missing_fields, not {self.signal}")
        if self.signal == "client_signal":
            if not self.header or (self.below is None and self.equals is None):
                raise ValueError("client_signal needs a `header` and `below` and/or `equals`")
        elif self.header is not None or self.below is not None or self.equals is not None:
            raise ValueError(f"`header`, `below` and `equals` are only for client_signal, not {self.signal}")


class SchemaCache:
    """Compiled JSON Schema validators, keyed by the schema's canonical JSON, LRU-bounded.

    Compiling a schema costs far more than validating one answer, and a route sees the
    same few schemas on every request, so they are compiled once. jsonschema itself is
    imported on the first schema (~0.2 s): most gateways never check one.
    """

    def __init__(self, capacity: int = MAX_VALIDATORS) -> None:
        self._capacity = capacity
        self._compiled: OrderedDict[bytes, Any] = OrderedDict()  # validator, or the schema's problem as str

    def __len__(self) -> int:
        return len(self._compiled)

    def problem(self, schema: Any, instance: Any) -> str | None:
        """Why `instance` fails `schema` (or why the schema is unusable); None when it conforms."""
        validator = self._validator(schema)
        if isinstance(validator, str):
            return validator
        from referencing.exceptions import Unresolvable  # loaded with jsonschema by _compile

        try:
            error = next(iter(validator.iter_errors(instance)), None)
        except Unresolvable as exc:
            return short(f"invalid schema: unresolvable $ref {exc}")
        except RecursionError:
            return "invalid schema or answer: nested too deeply to check"
        if error is None:
            return None
        return short(f"{error.json_path}: {error.message}")

    def _validator(self, schema: Any) -> Any:
        try:
            key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            return "invalid schema: not JSON"
        cached = self._compiled.get(key)
        if cached is not None:
            self._compiled.move_to_end(key)
            return cached
        compiled = _compile(schema)
        self._compiled[key] = compiled
        if len(self._compiled) > self._capacity:
            self._compiled.popitem(last=False)
        return compiled


def _compile(schema: Any) -> Any:
    if not isinstance(schema, Mapping | bool):
        return "invalid schema: not an object"
    # jsonschema ships no type information; it is used through `SchemaCache` only.
    from jsonschema import Draft202012Validator, validators  # type: ignore[import-untyped]
    from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]

    # Draft 2020-12 unless the schema declares its own `$schema`.
    cls = validators.validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        return short(f"invalid schema: {exc.message}")
    return cls(schema)


@dataclass(frozen=True, slots=True)
class _Plan:
    """The configured checks, folded: which signals, the union of fields, client checks."""

    signals: frozenset[str]
    fields: tuple[str, ...]
    client: tuple[Check, ...]

    @classmethod
    def of(cls, checks: Iterable[Check]) -> _Plan:
        checks = tuple(checks)
        fields = tuple(dict.fromkeys(f for c in checks for f in c.fields))
        client = tuple(c for c in checks if c.signal == "client_signal")
        return cls(frozenset(c.signal for c in checks), fields, client)


@dataclass(frozen=True, slots=True)
class _Format:
    """What the request asked the answer to be."""

    wants_json: bool
    json_object: bool  # json_object mode: the answer must be a JSON object
    schema: Any  # json_schema mode's schema, or None

    @classmethod
    def of(cls, request: Mapping[str, Any]) -> _Format:
        fmt = request.get("response_format")
        kind = fmt.get("type") if isinstance(fmt, Mapping) else None
        if kind == "json_object":
            return cls(True, True, None)
        if kind == "json_schema":
            spec = fmt.get("json_schema") if isinstance(fmt, Mapping) else None
            return cls(True, False, spec.get("schema") if isinstance(spec, Mapping) else None)
        return cls(False, False, None)


class Verifier:
    """Runs the configured checks on a response; holds the compiled-validator cache."""

    def __init__(self, max_validators: int = MAX_VALIDATORS) -> None:
        self.schemas = SchemaCache(max_validators)

    def check(
        self, checks: Sequence[Check], request: Mapping[str, Any], response: Mapping[str, Any], headers: Mapping[str, str]
    ) -> list[Failure]:
        """Every failure of a configured signal, in choice order; [] when the answer passes."""
        if not checks:
            return []
        plan = _Plan.of(checks)
        failures = [f for c in plan.client if (f := client_signal_failure(c, headers)) is not None]
        if not plan.signals - {"client_signal"}:
            return failures
        fmt = _Format.of(request)
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices:
            if "empty" in plan.signals:
                failures.append(Failure("empty", "the response has no choices", 0))
            return failures
        for position, choice in enumerate(choices):
            if isinstance(choice, Mapping):
                failures += self._check_choice(plan, fmt, request, choice, position)
        return failures

    def _check_choice(
        self, plan: _Plan, fmt: _Format, request: Mapping[str, Any], choice: Mapping[str, Any], position: int
    ) -> list[Failure]:
        index = choice.get("index")
        index = index if isinstance(index, int) else position
        message = choice.get("message")
        message = message if isinstance(message, Mapping) else {}
        content = _text(message.get("content"))
        calls = has_tool_calls(message)
        out: list[Failure] = []
        if "truncated" in plan.signals and choice.get("finish_reason") == "length":
            out.append(Failure("truncated", "the answer hit the token limit (finish_reason length)", index))
        if "empty" in plan.signals and not calls and (content is None or not content.strip()):
            why = "the model refused" if message.get("refusal") else "no content and no tool calls"
            out.append(Failure("empty", why, index))
        if "invalid_tool_call" in plan.signals and calls:
            out += [Failure("invalid_tool_call", short(p), index) for p in tool_call_problems(request, message, self.schemas.problem)]
        if fmt.wants_json and not calls and plan.signals & JSON_SIGNALS:
            out += self._json_failures(plan, fmt, content, index)
        return out

    def _json_failures(self, plan: _Plan, fmt: _Format, content: str | None, index: int) -> list[Failure]:
        try:
            parsed = orjson.loads(content) if content is not None else None
            problem = None if content is not None else "no content"
        except orjson.JSONDecodeError as exc:
            parsed, problem = None, f"not valid JSON: {exc}"
        if problem is None and fmt.json_object and not isinstance(parsed, dict):
            problem = "not a JSON object"
        if problem is not None:
            return _unparsed(plan, fmt, problem, index)
        out: list[Failure] = []
        if "schema_mismatch" in plan.signals and fmt.schema is not None:
            mismatch = self.schemas.problem(fmt.schema, parsed)
            if mismatch is not None:
                out.append(Failure("schema_mismatch", mismatch, index))
        if "missing_fields" in plan.signals and plan.fields:
            missing = [path for path in plan.fields if _is_blank(_lookup(parsed, path))]
            if missing:
                out.append(Failure("missing_fields", short("missing or empty: " + ", ".join(missing)), index))
        return out


def _unparsed(plan: _Plan, fmt: _Format, problem: str, index: int) -> list[Failure]:
    """Content that is not the JSON asked for is invalid_json; only when that signal is not
    configured is it charged to the other JSON signals, since it cannot pass them either."""
    if "invalid_json" in plan.signals:
        return [Failure("invalid_json", short(problem), index)]
    out: list[Failure] = []
    if "schema_mismatch" in plan.signals and fmt.schema is not None:
        out.append(Failure("schema_mismatch", short(problem), index))
    if "missing_fields" in plan.signals and plan.fields:
        out.append(Failure("missing_fields", short(problem), index))
    return out


def client_signal_failure(check: Check, headers: Mapping[str, str]) -> Failure | None:
    """A missing header passes, and so does a `below` header that is not a number: only a
    signal the client actually sent may cost an escalation."""
    name = check.header or ""
    raw = _header(headers, name)
    if raw is None:
        return None
    value = raw.strip()
    if check.equals is not None and value.casefold() == check.equals.casefold():
        return Failure("client_signal", short(f"{name} is {check.equals!r}"), REQUEST_LEVEL)
    if check.below is not None:
        try:
            number = float(value)
        except ValueError:
            return None
        if number < check.below:  # NaN compares False: passes
            return Failure("client_signal", short(f"{name} {number:g} is below {check.below:g}"), REQUEST_LEVEL)
    return None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name.lower())  # ASGI and starlette headers are lower-case
    if value is not None:
        return value
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


def _text(content: Any) -> str | None:
    """Message content as text; content parts (a list of {type: text}) are joined."""
    if isinstance(content, str) or content is None:
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return None


def _lookup(value: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _is_blank(value: Any) -> bool:
    if isinstance(value, str):
        return not value.strip()
    return value is None or (isinstance(value, list | dict) and not value)


def short(text: str, limit: int = DETAIL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
