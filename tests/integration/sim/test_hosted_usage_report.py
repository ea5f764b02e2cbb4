"""The provider's own usage and cost reports, the other side of reconciliation."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.tokens.counting import count_chat_tokens, count_text_tokens
from tests.integration.sim.conftest import RunningHosted

HELLO: list[Any] = [{"role": "user", "content": "Say hello"}]
ADMIN = {"authorization": "Bearer sk-admin"}


def chat(sim: RunningHosted, key: str, model: str, **extra: Any) -> httpx.Response:
    response = httpx.post(f"{sim.url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                          json={"model": model, "messages": HELLO} | extra)
    response.raise_for_status()
    return response


def report(sim: RunningHosted, path: str, **params: Any) -> Any:
    params.setdefault("start_time", int(time.time()) - 60)
    response = httpx.get(f"{sim.url}/v1/organization/{path}", headers=ADMIN, params=params)
    response.raise_for_status()
    return response.json()


def test_usage_buckets_group_by_model_and_key(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted()
    chat(sim, "sk-alice", "sim-small")
    chat(sim, "sk-alice", "sim-small", max_tokens=5)
    chat(sim, "sk-bob", "sim-large")
    page = report(sim, "usage/completions", bucket_width="1d", group_by=["model", "api_key_id"])
    assert page["object"] == "page" and page["has_more"] is False
    [bucket] = page["data"]
    assert bucket["object"] == "bucket" and bucket["end_time"] - bucket["start_time"] == 86400
    results = {(r["model"], r["api_key_id"]): r for r in bucket["results"]}
    alice = next(r for (model, key), r in results.items() if model == "sim-small")
    assert alice["object"] == "organization.usage.completions.result"
    assert alice["num_model_requests"] == 2 and alice["output_tokens"] == 25
    assert alice["api_key_id"].startswith("key_") and alice["project_id"] is None and alice["batch"] is False
    assert len({key for _, key in results}) == 2, "two bearer keys, two api_key_ids"
    assert "sk-alice" not in str(page), "the report never shows the key itself"


def test_costs_use_model_prices(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted()
    usage = chat(sim, "sk-alice", "sim-large").json()["usage"]
    [bucket] = report(sim, "costs", bucket_width="1d")["data"]
    [result] = bucket["results"]
    assert result["object"] == "organization.costs.result" and result["line_item"] == "sim-large"
    expected = (usage["prompt_tokens"] * 2.50 + usage["completion_tokens"] * 10.00) / 1e6
    assert result["amount"] == {"value": pytest.approx(expected), "currency": "usd"}


def test_inject_and_omit_change_the_report(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted()
    seen = chat(sim, "sk-alice", "sim-small")
    injected = httpx.post(f"{sim.url}/sim/usage/inject", json={
        "model": "sim-small", "api_key_id": "key_ghost", "input_tokens": 500, "output_tokens": 7, "cached_tokens": 0}).json()
    assert injected["request_id"].startswith("req_")

    def totals() -> dict[str | None, int]:
        [bucket] = report(sim, "usage/completions", group_by="api_key_id")["data"]
        return {r["api_key_id"]: r["input_tokens"] for r in bucket["results"]}

    assert totals()["key_ghost"] == 500
    omitted = httpx.post(f"{sim.url}/sim/usage/omit", json={"request_id": seen.headers["x-request-id"]})
    assert omitted.status_code == 200
    assert set(totals()) == {"key_ghost"}
    assert httpx.post(f"{sim.url}/sim/usage/omit", json={"request_id": "req_nope"}).status_code == 404


def test_report_needs_a_key_and_a_start_time(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted()
    assert httpx.get(f"{sim.url}/v1/organization/usage/completions", params={"start_time": 0}).status_code == 401
    assert httpx.get(f"{sim.url}/v1/organization/usage/completions", headers=ADMIN).status_code == 400


def test_a_provider_whose_tokenizer_counts_twice_as_many_bills_its_own_count(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(tokens_per_tiktoken=2.0)
    messages = [{"role": "user", "content": "Name three rivers that flow through Europe, with one fact each."}]
    plain = chat(sim, "sk-alice", "gpt-4o-mini", messages=messages).json()["usage"]
    assert plain["prompt_tokens"] == 2 * count_chat_tokens(messages, "o200k_base")
    assert plain["total_tokens"] == plain["prompt_tokens"] + plain["completion_tokens"]
    streamed = httpx.post(f"{sim.url}/v1/chat/completions", headers={"authorization": "Bearer sk-alice"},
                          json={"model": "gpt-4o-mini", "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True}}).text
    last = json.loads([line for line in streamed.split("\n\n") if line.startswith("data: {")][-1].removeprefix("data: "))
    assert last["usage"]["prompt_tokens"] == plain["prompt_tokens"]

    text = httpx.post(f"{sim.url}/v1/completions", json={"model": "gpt-4o-mini", "prompt": "Once upon a time"}).json()
    assert text["usage"]["prompt_tokens"] == 2 * count_text_tokens("Once upon a time", "o200k_base")
    ids = httpx.post(f"{sim.url}/v1/completions", json={"model": "gpt-4o-mini", "prompt": [101, 2023, 2003]}).json()
    assert ids["usage"]["prompt_tokens"] == 3, "token ids are the provider's own tokens"
    embedded = httpx.post(f"{sim.url}/v1/embeddings", json={"model": "text-embedding-3-small", "input": "embed me"}).json()
    assert embedded["usage"]["prompt_tokens"] == 2 * count_text_tokens("embed me", "cl100k_base")

    [bucket] = report(sim, "usage/completions", bucket_width="1d")["data"]
    [result] = bucket["results"]
    prompts = [plain["prompt_tokens"], last["usage"]["prompt_tokens"], text["usage"]["prompt_tokens"], 3]
    assert (result["input_tokens"], result["num_model_requests"]) == (sum(prompts), 4), "the report bills what usage said"
