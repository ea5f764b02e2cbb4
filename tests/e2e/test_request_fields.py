"""A field of the wrong type or out of range is a 400 that names it (`param`), on the
task and tool endpoints as on the model calls; JSON nested deeper than the gateway
writes again is a 400 on every endpoint that takes JSON."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.test_caching import ToolServer
from tests.support.servers import run_asgi_in_thread
from tests.support.stack import Stack, running_stack

DEEP = "[" * 1000 + "]" * 1000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with run_asgi_in_thread(ToolServer()) as tools:
        def edit(text: str) -> str:
            return text + f"tools:\n  lookup:\n    url: {tools}/lookup\n  getter:\n    url: {tools}/get\n    method: GET\n"
        with running_stack(tmp_path_factory.mktemp("fields"), edit_policy=edit) as running:
            yield running


def post(stack: Stack, path: str, body: str | dict[str, Any], **headers: str) -> httpx.Response:
    content = body if isinstance(body, str) else httpx.Request("POST", "/", json=body).content.decode()
    return httpx.post(f"{stack.gateway}{path}", content=content.encode(), timeout=30,
                      headers={"authorization": f"Bearer {stack.key}", "content-type": "application/json", **headers})


def refused(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize("field,value", [
    ("budget_usd", ""), ("budget_usd", "two dollars"), ("budget_usd", "NaN"), ("budget_usd", "-Infinity"),
    ("budget_usd", -1), ("budget_usd", "1e400"), ("budget_usd", 10**7), ("budget_usd", True), ("budget_usd", []),
    ("budget_usd", {"usd": 1}),
    ("max_calls", 0), ("max_calls", -5), ("max_calls", 2.5), ("max_calls", "5"), ("max_calls", True),
    ("max_calls", 10**12), ("max_calls", 1e300),
    ("max_tokens", 0), ("max_tokens", 10**18), ("max_tokens", "many"), ("max_tokens", [1]),
    ("deadline_s", 0), ("deadline_s", -1), ("deadline_s", 10**9), ("deadline_s", "600"), ("deadline_s", False),
    ("metadata", {"a": 1}),
])
def test_each_task_field_of_the_wrong_type_or_range_is_a_400_naming_it(stack: Stack, field: str, value: Any) -> None:
    error = refused(post(stack, "/tasks", {field: value}))
    assert error["param"] == field
    assert field in error["message"]


def test_task_fields_in_range_open_a_task(stack: Stack) -> None:
    opened = post(stack, "/tasks", {"budget_usd": "2.00", "max_calls": 50, "max_tokens": 200000, "deadline_s": 600})
    assert opened.status_code == 201, opened.text
    assert opened.json()["budget_usd"] == "2.00"
    as_number = post(stack, "/tasks", {"budget_usd": 0.5, "max_calls": 5.0, "deadline_s": 1.5, "max_tokens": None})
    assert as_number.status_code == 201, as_number.text
    assert as_number.json()["budget_usd"] == "0.5" and as_number.json()["max_calls"] == 5


@pytest.mark.parametrize("body,param", [
    ({"arguments": []}, "arguments"), ({"arguments": "q=paris"}, "arguments"), ({"arguments": 3}, "arguments"),
    ({"args": {"q": "paris"}}, "args"),
])
def test_tool_call_fields_of_the_wrong_type_are_a_400_naming_them(stack: Stack, body: dict[str, Any], param: str) -> None:
    assert refused(post(stack, "/tools/lookup/invoke", body))["param"] == param


def test_a_get_tool_refuses_arguments_too_long_for_its_url(stack: Stack) -> None:
    error = refused(post(stack, "/tools/getter/invoke", {"arguments": {"q": "x" * 20_000}}))
    assert error["param"] == "arguments" and "GET" in error["message"]
    assert post(stack, "/tools/getter/invoke", {"arguments": {"q": "paris"}}).status_code == 200
    assert post(stack, "/tools/lookup/invoke", {"arguments": None}).json()["result"]["echo"] == {}


@pytest.mark.parametrize("path,body", [
    ("/chat/completions", f'{{"model": "gpt-4o-mini", "messages": [{{"role": "user", "content": "hi"}}], "metadata": {DEEP}}}'),
    ("/completions", f'{{"model": "gpt-4o-mini", "prompt": "hi", "metadata": {DEEP}}}'),
    ("/embeddings", f'{{"model": "text-embedding-3-small", "input": "hi", "metadata": {DEEP}}}'),
    ("/tasks", f'{{"metadata": {DEEP}}}'),
    ("/tools/lookup/invoke", f'{{"metadata": {DEEP}}}'),
])
def test_json_nested_1000_deep_is_a_400_on_every_endpoint(stack: Stack, path: str, body: str) -> None:
    error = refused(post(stack, path, body))
    assert error["param"] == "metadata"
    assert "240 levels" in error["message"]


def test_arguments_nested_as_deep_as_allowed_reach_the_tool(stack: Stack) -> None:
    nested = "[" * 238 + "]" * 238  # 240 levels with the body and `arguments` around it
    answered = post(stack, "/tools/lookup/invoke", f'{{"arguments": {{"q": {nested}}}}}')
    assert answered.status_code == 200, answered.text
    one_more = refused(post(stack, "/tools/lookup/invoke", f'{{"arguments": {{"q": [{nested}]}}}}'))
    assert one_more["param"] == "arguments"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_an_output_bound_past_any_model_is_a_400_before_anything_is_held(stack: Stack, field: str) -> None:
    # Held against a task's budget, 2**63 - 1 tokens once made a hold past the ledger's 64 bits (a 500).
    task = post(stack, "/tasks", {"budget_usd": "100"}).json()["id"]
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], field: 2**63 - 1}
    assert refused(post(stack, "/chat/completions", body, **{"x-task-id": task}))["param"] == field
    assert refused(post(stack, "/completions", {"model": "gpt-4o-mini", "prompt": "hi", "max_tokens": 10**8}))["param"] == "max_tokens"
    assert post(stack, "/tasks", {"budget_usd": "5"}).status_code == 201, "the ledger still takes writes"
    answered = post(stack, "/chat/completions", {**body, field: 10_000_000}, **{"x-task-id": task})
    assert answered.status_code == 200, answered.text


@pytest.mark.parametrize("message,param", [
    ({"role": "assistant", "content": None, "tool_calls": True}, "messages[0].tool_calls"),
    ({"role": "assistant", "content": None, "tool_calls": [1]}, "messages[0].tool_calls"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": "f"}]}, "messages[0].tool_calls"),
])
def test_chat_message_tool_calls_must_be_a_list_of_calls(stack: Stack, message: dict[str, Any], param: str) -> None:
    assert refused(post(stack, "/chat/completions", {"model": "gpt-4o-mini", "messages": [message]}))["param"] == param


def test_a_whole_float_past_64_bits_is_passed_on_not_a_failure(stack: Stack) -> None:
    # The response cache writes 1.0 as 1 in its keys; -1e308 as an integer has no 64-bit form.
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "temperature": -1e308, "seed": 1}
    assert post(stack, "/chat/completions", body).status_code == 200
