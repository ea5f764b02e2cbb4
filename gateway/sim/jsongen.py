"""Schema-driven JSON values for structured outputs and tool-call arguments.

Covers the JSON Schema subset OpenAI's structured outputs accept: object, array,
string (enum, const, formats, length bounds), integer/number (bounds), boolean, null,
anyOf/oneOf/allOf, type lists and local `$ref`s into `$defs`/`definitions`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from gateway.sim.textgen import WORDS

MAX_DEPTH = 8
_FORMATS = {
    "date": "2024-05-17",
    "date-time": "2024-05-17T09:30:00Z",
    "time": "09:30:00",
    "email": "user@example.com",
    "uuid": "123e4567-e89b-42d3-a456-426614174000",
    "uri": "https://example.com/item",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
}


class SchemaJson:
    """Generates one value conforming to `schema`, drawing choices from `rng`."""

    def __init__(self, schema: Mapping[str, Any], rng: random.Random) -> None:
        self._root = schema
        self._rng = rng

    def value(self) -> Any:
        return self._for(self._root, 0)

    def _for(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, Mapping) or depth > MAX_DEPTH:
            return None
        schema = self._resolve(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self._rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                return self._for(_prefer_non_null(options), depth + 1)
        if isinstance(schema.get("allOf"), list):
            return self._for(_merge_all_of(schema), depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in schema else "string"
        return self._by_type(str(kind), schema, depth)

    def _by_type(self, kind: str, schema: Mapping[str, Any], depth: int) -> Any:
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "integer":
            low, high = _bounds(schema, 0, 100)
            return self._rng.randint(int(low), int(high))
        if kind == "number":
            low, high = _bounds(schema, 0, 100)
            return round(self._rng.uniform(low, high), 2)
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "null":
            return None
        return self._string(schema)

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        out: dict[str, Any] = {}
        if isinstance(properties, Mapping):
            for name, sub in properties.items():
                out[str(name)] = self._for(sub, depth + 1)
        for name in schema.get("required") or ():
            if isinstance(name, str) and name not in out:
                out[name] = self._string({})
        return out

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        low = int(schema.get("minItems", 1))
        high = int(schema.get("maxItems", max(low, 3)))
        count = self._rng.randint(low, max(low, high))
        return [self._for(schema.get("items", {}), depth + 1) for _ in range(count)]

    def _string(self, schema: Mapping[str, Any]) -> str:
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in _FORMATS:
            return _FORMATS[fmt]
        text = "".join(self._rng.choices(WORDS, k=self._rng.randint(1, 3))).strip()
        min_len = int(schema.get("minLength", 0))
        max_len = schema.get("maxLength")
        while len(text) < min_len:
            text += "x"
        return text[: int(max_len)] if isinstance(max_len, int) else text

    def _resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        node: Any = self._root
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, Mapping) else None
        return node if isinstance(node, Mapping) else {}


def _prefer_non_null(options: list[Any]) -> Any:
    for option in options:
        if not (isinstance(option, Mapping) and option.get("type") == "null"):
            return option
    return options[0]


def _merge_all_of(schema: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    properties: dict[str, Any] = dict(merged.get("properties") or {})
    required: list[Any] = list(merged.get("required") or [])
    for part in schema["allOf"]:
        if isinstance(part, Mapping):
            merged.update({k: v for k, v in part.items() if k not in ("properties", "required")})
            properties.update(part.get("properties") or {})
            required.extend(part.get("required") or [])
    if properties:
        merged["properties"] = properties
    if required:
        merged["required"] = required
    return merged


def _bounds(schema: Mapping[str, Any], low: float, high: float) -> tuple[float, float]:
    lo = schema.get("minimum", schema.get("exclusiveMinimum", low))
    hi = schema.get("maximum", schema.get("exclusiveMaximum", high))
    lo_f = float(lo) + (1 if "exclusiveMinimum" in schema and "minimum" not in schema else 0)
    hi_f = float(hi) - (1 if "exclusiveMaximum" in schema and "maximum" not in schema else 0)
    if hi_f < lo_f:
        hi_f = lo_f + 100
    return lo_f, hi_f


def generate_json(schema: Mapping[str, Any] | None, rng: random.Random) -> Any:
    """A value for `schema`; with no schema (json_object mode) a small generic object."""
    if schema is None:
        schema = {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}}}
    return SchemaJson(schema, rng).value()
