"""invalid_tool_call: unknown tools, arguments that are not JSON, arguments off-schema."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.verify import Check, Failure, Verifier

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"],
    "additionalProperties": False,
}}}
NO_PARAMS = {"type": "function", "function": {"name": "now"}}
REQUEST = {"messages": [], "tools": [WEATHER, NO_PARAMS]}
CHECKS = [Check("invalid_tool_call")]


def call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def answer(*calls: dict[str, Any], index: int = 0) -> dict[str, Any]:
    message = {"role": "assistant", "content": None, "tool_calls": list(calls)}
    return {"index": index, "message": message, "finish_reason": "tool_calls"}


def run(request: dict[str, Any], *choices: dict[str, Any]) -> list[Failure]:
    return Verifier().check(CHECKS, request, {"choices": list(choices)}, {})


def test_good_calls_pass() -> None:
    assert run(REQUEST, answer(call("get_weather", '{"city": "Oslo", "days": 3}'), call("now", "{}"))) == []


@pytest.mark.parametrize(("arguments", "expected"), [
    ('{"city": "Os', "get_weather: arguments are not valid JSON"),
    ('["Oslo"]', "get_weather: arguments are not a JSON object"),
    ('{"days": 2}', "get_weather: $: 'city' is a required property"),
    ('{"city": "Oslo", "days": 0}', "get_weather: $.days: 0 is less than the minimum of 1"),
    ('{"city": "Oslo", "units": "C"}', "get_weather: $: Additional properties are not allowed ('units' was unexpected)"),
    (None, "get_weather: arguments are not a JSON object"),
])
def test_bad_arguments(arguments: Any, expected: str) -> None:
    [failure] = run(REQUEST, answer(call("get_weather", arguments)))
    assert (failure.signal, failure.detail) == ("invalid_tool_call", expected)


def test_unknown_tool() -> None:
    [failure] = run(REQUEST, answer(call("delete_everything", "{}")))
    assert failure.detail == "unknown tool 'delete_everything'"
    [failure] = run({"messages": []}, answer(call("get_weather", '{"city": "Oslo"}')))
    assert failure.detail == "unknown tool 'get_weather'"


def test_tool_without_parameters_takes_any_object() -> None:
    assert run(REQUEST, answer(call("now", '{"tz": "UTC"}'))) == []
    assert run(REQUEST, answer(call("now", "{}"))) == []


def test_every_bad_call_of_every_choice_is_reported() -> None:
    failures = run(REQUEST, answer(call("get_weather", "{}"), call("nope", "{}")), answer(call("get_weather", '{"city": "x"}'), index=1),
                   answer(call("get_weather", "oops"), index=2))
    assert [f.choice for f in failures] == [0, 0, 2]


def test_invalid_parameters_schema_is_reported_not_raised() -> None:
    broken = {"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}
    [failure] = run({"tools": [broken]}, answer(call("f", "{}")))
    assert failure.detail.startswith("f: invalid schema")


def test_legacy_function_call() -> None:
    request = {"functions": [WEATHER["function"]]}
    message = {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}}
    [failure] = run(request, {"index": 0, "message": message, "finish_reason": "function_call"})
    assert "'city' is a required property" in failure.detail


def test_tool_call_answers_skip_json_checks() -> None:
    request = {**REQUEST, "response_format": {"type": "json_object"}}
    checks = [Check("invalid_json"), Check("missing_fields", ("name",)), Check("empty")]
    assert Verifier().check(checks, request, {"choices": [answer(call("now", "{}"))]}, {}) == []


def test_not_configured_not_checked() -> None:
    assert Verifier().check([Check("truncated")], REQUEST, {"choices": [answer(call("nope", "{"))]}, {}) == []
