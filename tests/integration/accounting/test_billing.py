"""Streamed and cached-prefix responses are billed at the right prices, exactly:
cached prompt tokens at the cached rate, the rest at the input rate."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.sim.vllm import VllmSimConfig
from tests.e2e.test_openai_sdk import wait_until
from tests.support.stack import ADMIN_KEY, Stack, running_stack

MILLION = Decimal(1_000_000)
PRICES = {  # as the test policy sets them, USD per 1M tokens
    "gpt-4o-mini": (Decimal("0.15"), Decimal("0.075"), Decimal("0.60")),
    "pool-model": (Decimal("0.05"), Decimal("0.01"), Decimal("0.20")),
}
LONG_PREFIX = "You are a careful assistant for the accounts team. " * 160  # well over 1,024 tokens


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    vllm = VllmSimConfig(enable_prompt_tokens_details=True)
    with running_stack(tmp_path_factory.mktemp("billing"), vllm_config=vllm) as running:
        yield running


def expected_usd(model: str, usage: Any) -> Decimal:
    inp, cached_rate, out = PRICES[model]
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return ((usage.prompt_tokens - cached) * inp + cached * cached_rate + usage.completion_tokens * out) / MILLION


def messages(question: str) -> list[Any]:
    return [{"role": "system", "content": LONG_PREFIX}, {"role": "user", "content": question}]


def new_task(stack: Stack) -> str:
    r = httpx.post(f"{stack.gateway}/tasks", headers={"authorization": f"Bearer {stack.key}"}, json={})
    assert r.status_code == 201, r.text
    task_id: str = r.json()["id"]
    return task_id


def task_events(stack: Stack, task_id: str) -> list[dict[str, Any]]:
    books = httpx.get(f"{stack.gateway}/tasks/{task_id}", headers={"authorization": f"Bearer {stack.key}"}).json()
    events: list[dict[str, Any]] = books["events"]
    return events


@pytest.mark.parametrize("model", ["gpt-4o-mini", "pool-model"])
def test_cached_prefix_is_billed_at_the_cached_rate(stack: Stack, model: str) -> None:
    client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
    first = client.chat.completions.with_raw_response.create(model=model, messages=messages("First question?"))
    second = client.chat.completions.with_raw_response.create(model=model, messages=messages("Second question?"))
    usage = second.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens >= 1024, "the shared prefix should hit the provider's cache"
    for raw in (first, second):
        assert Decimal(raw.headers["x-gateway-cost-usd"]) == expected_usd(model, raw.parse().usage)
    assert Decimal(second.headers["x-gateway-cost-usd"]) < Decimal(first.headers["x-gateway-cost-usd"])


@pytest.mark.parametrize("model", ["gpt-4o-mini", "pool-model"])
@pytest.mark.parametrize("client_wants_usage", [True, False])
def test_streamed_calls_are_billed_from_real_usage(stack: Stack, model: str, client_wants_usage: bool) -> None:
    task_id = new_task(stack)
    client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
    options = {"stream_options": {"include_usage": True}} if client_wants_usage else {}
    chunks = list(client.chat.completions.create(model=model, messages=messages(f"Stream {client_wants_usage}?"), stream=True,
                                                 extra_headers={"x-task-id": task_id}, **options))  # type: ignore[call-overload]
    # A stream is settled just after its last chunk reaches the client.
    wait_until(lambda: len(task_events(stack, task_id)) == 1)
    [event] = task_events(stack, task_id)
    assert event["status"] == "ok" and event["usage_confirmed"]
    # The same prompt non-streamed tells us the provider's usage for it (the simulator is deterministic).
    usage = client.chat.completions.create(model=model, messages=messages(f"Stream {client_wants_usage}?")).usage
    assert usage is not None
    assert event["completion_tokens"] == usage.completion_tokens > 0
    assert event["prompt_tokens"] == usage.prompt_tokens
    inp, cached_rate, out = PRICES[model]
    expected = ((event["prompt_tokens"] - event["cached_tokens"]) * inp + event["cached_tokens"] * cached_rate
                + event["completion_tokens"] * out) / MILLION
    assert Decimal(event["cost_usd"]) == expected
    assert (chunks[-1].usage is not None) == client_wants_usage


def test_finance_api_totals_match_the_requests(stack: Stack, tmp_path: Path) -> None:
    r = httpx.get(f"{stack.gateway.removesuffix('/v1')}/admin/costs", params={"group_by": "tenant,model,day"},
                  headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200, r.text
    rows = r.json()["rows"]
    assert rows and {"tenant", "model", "day", "cost_usd", "requests", "input_tokens", "cached_tokens", "output_tokens", "saved_usd"} <= set(rows[0])
    assert all(row["tenant"] == "acme" for row in rows)
    pool = [row for row in rows if row["model"] == "pool-model"]
    assert pool and Decimal(pool[0]["saved_usd"]) > 0, "cached tokens save money and finance should see how much"
    csv = httpx.get(f"{stack.gateway.removesuffix('/v1')}/admin/costs", params={"group_by": "model", "format": "csv"},
                    headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert csv.headers["content-type"].startswith("text/csv")
    assert csv.text.splitlines()[0] == "model,cost_usd,requests,input_tokens,cached_tokens,output_tokens,saved_usd"
    denied = httpx.get(f"{stack.gateway.removesuffix('/v1')}/admin/costs", headers={"authorization": f"Bearer {stack.key}"})
    assert denied.status_code == 401
