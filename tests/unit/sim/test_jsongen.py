"""Structured outputs and tool arguments conform to the JSON Schema they were asked for."""

from __future__ import annotations

import random
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from gateway.sim.jsongen import generate_json

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 18, "maximum": 99}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green"]}, "minItems": 2, "maxItems": 4},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "ok": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "when": {"type": "string", "format": "date-time"},
        "kind": {"const": "fixed"},
    }, "required": ["tags", "score", "ok", "note", "when", "kind"]},
    {"$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string", "minLength": 5}}, "required": ["sku"]}},
     "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}}}, "required": ["items"]},
    {"type": "object", "properties": {"choice": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 5, "maximum": 6}]}},
     "required": ["choice"]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
               {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
    {"type": "object", "required": ["only_required"]},
]


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generated_value_validates(schema: dict[str, Any], seed: int) -> None:
    value = generate_json(schema, random.Random(seed))
    jsonschema.validate(value, schema)


def test_same_seed_same_value_and_json_object_mode_is_an_object() -> None:
    schema = SCHEMAS[1]
    assert generate_json(schema, random.Random(7)) == generate_json(schema, random.Random(7))
    assert isinstance(generate_json(None, random.Random(0)), dict)
