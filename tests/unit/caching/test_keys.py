from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from gateway.caching.keys import (
    SHARED_SCOPE,
    TRANSPORT_FIELDS,
    cache_key,
    canonical_arguments,
    canonical_request,
    is_deterministic,
    response_namespace,
    tenant_scope,
    tool_key,
    tool_namespace,
)

SECRET = b"gateway-secret-for-tests"
BODY: dict[str, Any] = {
    "model": "auto-cheap",
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    "temperature": 0,
}


def canon(body: dict[str, Any], model: str = "gpt-4o-mini", endpoint: str = "chat.completions") -> bytes:
    return canonical_request(endpoint, model, body)


@pytest.mark.parametrize("field,value", [
    ("stream", True),
    ("stream_options", {"include_usage": True}),
    ("user", "end-user-42"),
    ("safety_identifier", "hashed-user"),
    ("prompt_cache_key", "pk"),
    ("cache_salt", "salt"),
    ("metadata", {"trace": "abc"}),
    ("store", True),
    ("service_tier", "flex"),
    ("model", "some-other-client-name"),
])
def test_transport_fields_do_not_change_the_canonical_form(field: str, value: Any) -> None:
    assert canon({**BODY, field: value}) == canon(BODY)


def test_every_documented_transport_field_is_covered() -> None:
    assert {"model", "stream", "stream_options", "user", "safety_identifier", "prompt_cache_key",
                                "cache_salt", "metadata", "store", "service_tier"} == TRANSPORT_FIELDS


@pytest.mark.parametrize("field,value", [
    ("messages", [{"role": "user", "content": "What is 2+3?"}]),
    ("tools", [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]),
    ("tool_choice", "required"),
    ("response_format", {"type": "json_object"}),
    ("temperature", 0.7),
    ("top_p", 0.5),
    ("max_tokens", 10),
    ("max_completion_tokens", 10),
    ("n", 2),
    ("stop", ["\n"]),
    ("seed", 7),
    ("logit_bias", {"1234": -100}),
    ("presence_penalty", 0.5),
    ("frequency_penalty", 0.5),
    ("logprobs", True),
    ("top_logprobs", 3),
    ("reasoning_effort", "high"),  # a field the gateway does not know may change the answer
])
def test_every_answer_changing_field_changes_the_canonical_form(field: str, value: Any) -> None:
    assert canon({**BODY, field: value}) != canon(BODY)


def test_the_routed_model_and_endpoint_matter_not_the_clients_model_name() -> None:
    assert canon(BODY, model="gpt-4o-mini") != canon(BODY, model="gpt-4o")
    assert canon(BODY, endpoint="chat.completions") != canon(BODY, endpoint="completions")
    assert orjson.loads(canon(BODY))["model"] == "gpt-4o-mini"


def test_key_order_and_integral_floats_do_not_matter() -> None:
    reordered = {"temperature": 0.0, "messages": [{"content": "Be brief.", "role": "system"}, BODY["messages"][1]], "model": "x"}
    assert canon(reordered) == canon(BODY)
    assert b" " not in canon(BODY).replace(b"Be brief.", b"").replace(b"What is 2+2?", b"")  # compact


def test_the_same_request_from_two_tenants_gets_two_keys() -> None:
    canonical = canon(BODY)
    acme = cache_key(SECRET, tenant_scope("acme"), canonical)
    globex = cache_key(SECRET, tenant_scope("globex"), canonical)
    assert acme != globex
    assert acme == cache_key(SECRET, tenant_scope("acme"), canon(dict(BODY)))
    assert cache_key(b"another-secret", tenant_scope("acme"), canonical) != acme


def test_keys_are_hex_macs_that_carry_no_prompt_text() -> None:
    key = cache_key(SECRET, tenant_scope("acme"), canon(BODY))
    assert re.fullmatch(r"[0-9a-f]{64}", key)


def test_namespaces_carry_the_scope_as_a_hash_tag() -> None:
    assert response_namespace(tenant_scope("acme")) == "resp:{t:acme}"
    assert tool_namespace(tenant_scope("acme"), "search") == "tool:{t:acme}:search"
    assert tool_key("3", "ab12") == "3:ab12"
    # a tenant called "shared" never lands in the shared (public) scope
    assert response_namespace(tenant_scope(SHARED_SCOPE)) != response_namespace(SHARED_SCOPE)


@pytest.mark.parametrize("scope", ["", "a{b", "a}b", "a#b", "a\x00b"])
def test_scopes_that_would_break_the_hash_tag_or_the_mac_are_refused(scope: str) -> None:
    with pytest.raises(ValueError):
        response_namespace(scope)
    with pytest.raises(ValueError):
        cache_key(SECRET, scope, b"{}")


@pytest.mark.parametrize("body,expected", [
    ({"temperature": 0}, True),
    ({"temperature": 0.0}, True),
    ({"temperature": 0.2, "seed": 1}, True),
    ({"seed": 0}, True),
    ({}, False),  # provider default temperature is 1
    ({"temperature": 0.2}, False),
    ({"temperature": False}, False),
    ({"seed": None}, False),
])
def test_determinism_rule(body: dict[str, Any], expected: bool) -> None:
    assert is_deterministic(body) is expected


def test_canonical_arguments_ignore_key_order_and_encoding() -> None:
    assert canonical_arguments('{"b": 1, "a": {"y": 2, "x": 3}}') == canonical_arguments({"a": {"x": 3, "y": 2}, "b": 1})
    assert canonical_arguments({"q": "tea"}) != canonical_arguments({"q": "coffee"})
    assert canonical_arguments("not json") != canonical_arguments('"not json"')
