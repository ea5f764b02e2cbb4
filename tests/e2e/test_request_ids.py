"""Every response names its request with `x-request-id`: the framework's routes (models,
readiness, metrics, admin, tasks, tools) and their errors as the model calls do, so a
user can quote it and an operator find it."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.stack import ADMIN_KEY, METRICS_KEY, Stack


def ask(stack: Stack, method: str, path: str, bearer: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {bearer}"} if bearer else {}
    return httpx.request(method, stack.root + path, headers=headers, timeout=20, **kwargs)


@pytest.mark.parametrize(("method", "path", "who", "status"), [
    ("GET", "/v1/models", "tenant", 200),
    ("GET", "/v1/models", None, 401),
    ("GET", "/v1/models/gpt-4o-mini", "tenant", 200),
    ("GET", "/v1/models/gpt-4o-mimi", "tenant", 404),
    ("DELETE", "/v1/models", "tenant", 405),
    ("GET", "/readyz", None, 200),
    ("GET", "/metrics", "metrics", 200),
    ("GET", "/metrics", None, 401),
    ("GET", "/admin/costs", "admin", 200),
    ("GET", "/admin/costs", "tenant", 401),
    ("POST", "/v1/tasks", "tenant", 201),
    ("GET", "/v1/tasks/task_unknown", "tenant", 404),
    ("POST", "/v1/tools/no-such-tool/invoke", "tenant", 404),
    ("GET", "/ui/", None, 200),
    ("GET", "/ui/export/tenants.csv", None, 401),
    ("GET", "/no/such/path", None, 404),
    ("POST", "/v1/chat/completions", None, 401),  # a hot path, for comparison
])
def test_each_response_carries_a_request_id(stack: Stack, method: str, path: str, who: str | None, status: int) -> None:
    bearer = {"tenant": stack.key, "admin": ADMIN_KEY, "metrics": METRICS_KEY, None: None}[who]
    reply = ask(stack, method, path, bearer, json={} if method == "POST" else None)
    assert reply.status_code == status, reply.text
    assert len(reply.headers.get_list("x-request-id")) == 1
    assert reply.headers["x-request-id"].startswith("req_")


def test_ids_differ_and_a_client_cannot_choose_one(stack: Stack) -> None:
    ids = {httpx.get(f"{stack.root}/readyz", headers={"x-request-id": "mine"}).headers["x-request-id"] for _ in range(3)}
    assert len(ids) == 3 and "mine" not in ids


def test_the_sdk_sees_the_id_on_models_and_on_their_errors(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
    assert client.models.with_raw_response.list().headers["x-request-id"].startswith("req_")
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o-mimi")
    assert missing.value.request_id is not None and missing.value.request_id.startswith("req_")
