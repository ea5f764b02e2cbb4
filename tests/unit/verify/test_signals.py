"""gateway.verify: each signal fails what it should and passes what it should."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.verify import REQUEST_LEVEL, Check, Failure, Verifier

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    "required": ["name", "age"],
}
SCHEMA_REQUEST = {"messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}
OBJECT_REQUEST = {"messages": [], "response_format": {"type": "json_object"}}
TEXT_REQUEST: dict[str, Any] = {"messages": []}


def choice(content: Any, finish: str = "stop", index: int = 0, **message: Any) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": content, **message}, "finish_reason": finish}


def response(*choices: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "choices": list(choices)}


def run(checks: list[Check], request: dict[str, Any], resp: dict[str, Any], headers: dict[str, str] | None = None) -> list[Failure]:
    return Verifier().check(checks, request, resp, headers or {})


def signals(failures: list[Failure]) -> list[str]:
    return [f.signal for f in failures]


GOOD_PERSON = orjson.dumps({"name": "Ada", "age": 36, "address": {"city": "London"}}).decode()


def test_nothing_configured_nothing_checked() -> None:
    assert run([], SCHEMA_REQUEST, response(choice("not json", "length"))) == []


@pytest.mark.parametrize("request_body", [SCHEMA_REQUEST, OBJECT_REQUEST])
def test_invalid_json(request_body: dict[str, Any]) -> None:
    checks = [Check("invalid_json")]
    [failure] = run(checks, request_body, response(choice('{"name": "Ada", "ag')))
    assert failure.signal == "invalid_json" and failure.choice == 0 and "not valid JSON" in failure.detail
    assert run(checks, request_body, response(choice(GOOD_PERSON))) == []
    assert signals(run(checks, request_body, response(choice(None)))) == ["invalid_json"]


def test_json_object_mode_needs_an_object() -> None:
    assert signals(run([Check("invalid_json")], OBJECT_REQUEST, response(choice("[1, 2]")))) == ["invalid_json"]
    assert run([Check("invalid_json")], SCHEMA_REQUEST | {"response_format": {"type": "json_schema", "json_schema": {
        "name": "list", "schema": {"type": "array"}}}}, response(choice("[1, 2]"))) == []


def test_text_requests_are_not_held_to_json() -> None:
    checks = [Check("invalid_json"), Check("schema_mismatch"), Check("missing_fields", ("name",))]
    assert run(checks, TEXT_REQUEST, response(choice("just words"))) == []
    assert run(checks, {"response_format": {"type": "text"}}, response(choice("just words"))) == []


def test_schema_mismatch() -> None:
    checks = [Check("schema_mismatch")]
    [failure] = run(checks, SCHEMA_REQUEST, response(choice('{"name": "Ada", "age": "old"}')))
    assert failure.signal == "schema_mismatch" and "$.age" in failure.detail
    [missing] = run(checks, SCHEMA_REQUEST, response(choice('{"name": "Ada"}')))
    assert "'age' is a required property" in missing.detail
    assert run(checks, SCHEMA_REQUEST, response(choice(GOOD_PERSON))) == []


def test_unparseable_content_is_invalid_json_only() -> None:
    checks = [Check("invalid_json"), Check("schema_mismatch"), Check("missing_fields", ("name",))]
    assert signals(run(checks, SCHEMA_REQUEST, response(choice("{oops")))) == ["invalid_json"]
    # Without invalid_json configured, not-JSON still cannot pass the other JSON checks.
    assert signals(run(checks[1:], SCHEMA_REQUEST, response(choice("{oops")))) == ["schema_mismatch", "missing_fields"]


def test_invalid_schema_is_a_failure_not_an_exception() -> None:
    for schema in ({"type": "strin"}, {"$ref": "#/$defs/nowhere"}, {"$ref": "https://example.com/remote.json"}, "nope"):
        request = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        [failure] = run([Check("schema_mismatch")], request, response(choice("{}")))
        assert failure.signal == "schema_mismatch" and failure.detail.startswith("invalid schema"), failure


def test_validators_are_compiled_once_per_schema() -> None:
    verifier = Verifier()
    for age in range(5):
        verifier.check([Check("schema_mismatch")], SCHEMA_REQUEST, response(choice(f'{{"name": "A", "age": {age}}}')), {})
    other = {"response_format": {"type": "json_schema", "json_schema": {"name": "y", "schema": {"type": "object"}}}}
    verifier.check([Check("schema_mismatch")], other, response(choice("{}")), {})
    assert len(verifier.schemas) == 2


def test_validator_cache_is_bounded() -> None:
    verifier = Verifier(max_validators=3)
    for n in range(10):
        request = {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"maxProperties": n}}}}
        verifier.check([Check("schema_mismatch")], request, response(choice("{}")), {})
    assert len(verifier.schemas) == 3


def test_missing_fields_nested_and_empty_values() -> None:
    checks = [Check("missing_fields", ("name", "address.city"))]
    assert run(checks, SCHEMA_REQUEST, response(choice(GOOD_PERSON))) == []
    for body in ({"name": "Ada"}, {"name": "Ada", "address": {}}, {"name": "Ada", "address": {"city": ""}},
                 {"name": "Ada", "address": "London"}, {"name": None, "address": {"city": "x"}}):
        [failure] = run(checks, OBJECT_REQUEST, response(choice(orjson.dumps(body).decode())))
        assert failure.signal == "missing_fields", body
    [failure] = run(checks, OBJECT_REQUEST, response(choice('{"name": "  ", "address": {"city": []}}')))
    assert failure.detail == "missing or empty: name, address.city"


def test_missing_fields_reaches_into_arrays_and_merges_checks() -> None:
    checks = [Check("missing_fields", ("items.0.sku",)), Check("missing_fields", ("total",))]
    assert run(checks, OBJECT_REQUEST, response(choice('{"items": [{"sku": "A1"}], "total": 0}'))) == []
    [failure] = run(checks, OBJECT_REQUEST, response(choice('{"items": [], "total": {}}')))
    assert failure.detail == "missing or empty: items.0.sku, total"


def test_truncated() -> None:
    assert signals(run([Check("truncated")], TEXT_REQUEST, response(choice("and then", "length")))) == ["truncated"]
    assert run([Check("truncated")], TEXT_REQUEST, response(choice("done.", "stop"))) == []


def test_empty() -> None:
    checks = [Check("empty")]
    for content in (None, "", "  \n", []):
        assert signals(run(checks, TEXT_REQUEST, response(choice(content)))) == ["empty"], content
    [refused] = run(checks, TEXT_REQUEST, response(choice(None, refusal="I can't help with that.")))
    assert refused.detail == "the model refused"
    assert run(checks, TEXT_REQUEST, response(choice("hi"))) == []
    assert run(checks, TEXT_REQUEST, response(choice([{"type": "text", "text": "hi"}]))) == []
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert run(checks, TEXT_REQUEST, response(choice(None, "tool_calls", tool_calls=[call]))) == []
    assert signals(run(checks, TEXT_REQUEST, {"choices": []})) == ["empty"]


def test_each_choice_is_checked_with_its_index() -> None:
    checks = [Check("invalid_json"), Check("truncated")]
    resp = response(choice(GOOD_PERSON, index=0), choice("{bad", index=1), choice(GOOD_PERSON, "length", index=2))
    failures = run(checks, SCHEMA_REQUEST, resp)
    assert [(f.signal, f.choice) for f in failures] == [("invalid_json", 1), ("truncated", 2)]


@pytest.mark.parametrize(("check", "value", "failed"), [
    (Check("client_signal", header="x-retrieval-coverage", below=0.5), "0.2", True),
    (Check("client_signal", header="x-retrieval-coverage", below=0.5), "0.5", False),
    (Check("client_signal", header="x-retrieval-coverage", below=0.5), "lots", False),
    (Check("client_signal", header="x-retrieval-coverage", below=0.5), "nan", False),
    (Check("client_signal", header="X-Validator", equals="fail"), " FAIL ", True),
    (Check("client_signal", header="X-Validator", equals="fail"), "pass", False),
])
def test_client_signal(check: Check, value: str, failed: bool) -> None:
    header = (check.header or "").lower()
    failures = run([check], TEXT_REQUEST, response(choice("ok")), {header: value})
    assert signals(failures) == (["client_signal"] if failed else [])
    assert all(f.choice == REQUEST_LEVEL for f in failures)


def test_client_signal_header_missing_passes_and_case_is_ignored() -> None:
    check = Check("client_signal", header="x-retrieval-coverage", below=0.5)
    assert run([check], TEXT_REQUEST, response(choice("ok")), {}) == []
    assert signals(run([check], TEXT_REQUEST, response(choice("ok")), {"X-Retrieval-Coverage": "0.1"})) == ["client_signal"]


def test_client_signal_needs_no_response_work() -> None:
    check = Check("client_signal", header="x-v", equals="fail")
    assert signals(run([check], TEXT_REQUEST, {"choices": "garbage"}, {"x-v": "fail"})) == ["client_signal"]


def test_details_stay_short() -> None:
    long_value = "x" * 500
    [failure] = run([Check("schema_mismatch")], SCHEMA_REQUEST, response(choice(orjson.dumps({"name": 1, "age": long_value}).decode())))
    assert len(failure.detail) <= 80


@pytest.mark.parametrize("kwargs", [
    {"signal": "vibes"},
    {"signal": "missing_fields"},
    {"signal": "missing_fields", "fields": ("a..b",)},
    {"signal": "truncated", "fields": ("a",)},
    {"signal": "client_signal", "header": "x-a"},
    {"signal": "client_signal", "below": 0.5},
    {"signal": "empty", "header": "x-a", "below": 0.5},
])
def test_bad_checks_fail_at_construction(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Check(**kwargs)


def test_fields_given_as_a_list_become_a_tuple() -> None:
    check = Check("missing_fields", ["name"])  # type: ignore[arg-type]
    assert check.fields == ("name",) and hash(check)
