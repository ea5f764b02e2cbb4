"""Provider trouble on demand: rate limits, injected 429/5xx, cut streams, bad bodies, slowness."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.integration.sim.conftest import RunningHosted, wait_until

HELLO: list[Any] = [{"role": "user", "content": "Say hello"}]
AUTH = {"authorization": "Bearer sk-test-key"}
CHAT = {"model": "sim-small", "messages": HELLO}


def post(sim: RunningHosted, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{sim.url}/v1/chat/completions", headers=AUTH, json=body, **kwargs)


def test_own_rpm_limit_answers_429_with_honest_retry_after(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(rpm=2)
    first = post(sim, CHAT)
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    post(sim, CHAT)
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="sk-test-key", max_retries=0)
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="sim-small", messages=HELLO)
    response = info.value.response
    assert info.value.code == "rate_limit_exceeded" and info.value.type == "requests"
    assert 25 <= int(response.headers["retry-after"]) <= 30  # one request refills in 30 s at 2 RPM
    assert 25_000 <= int(response.headers["retry-after-ms"]) <= 30_000
    assert response.headers["x-ratelimit-remaining-requests"] == "0"


def test_tpm_limit_counts_prompt_plus_completion_bound(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(tpm=100)
    assert post(sim, {**CHAT, "max_tokens": 50}).status_code == 200
    refused = post(sim, {**CHAT, "max_tokens": 60})
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "tokens"
    assert int(refused.headers["x-ratelimit-remaining-tokens"]) < 60


def test_injected_429_uses_configured_retry_after(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(fail_429_rate=1.0, retry_after_s=2.5)
    response = post(sim, CHAT)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3" and response.headers["retry-after-ms"] == "2500"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert httpx.get(f"{sim.url}/sim/usage").json()["data"] == [], "a refused request is not billed"


def test_injected_server_errors(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(fail_5xx_rate=1.0)
    statuses = {post(sim, CHAT).status_code for _ in range(12)}
    assert statuses <= {500, 503} and statuses
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="sk-test-key", max_retries=0)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="sim-small", messages=HELLO)
    assert info.value.type == "server_error"


def test_injected_server_errors_can_say_what_a_provider_behind_a_proxy_says(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(fail_5xx_rate=1.0)
    httpx.post(f"{sim.url}/sim/config", json={"server_error_message": "no healthy upstream at 10.0.0.7:8000"}).raise_for_status()
    error = post(sim, CHAT).json()["error"]
    assert error == {"message": "no healthy upstream at 10.0.0.7:8000", "type": "server_error", "param": None, "code": None}
    httpx.post(f"{sim.url}/sim/config", json={"server_error_message": None}).raise_for_status()
    assert post(sim, CHAT).json()["error"]["message"].startswith(("The server had an error", "The engine is currently overloaded"))


def test_faults_are_deterministic_for_a_seed(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(seed=3, fail_5xx_rate=0.5)

    def sequence() -> list[int]:
        return [post(sim, CHAT).status_code for _ in range(16)]

    first = sequence()
    assert 200 in first and any(s >= 500 for s in first)
    httpx.post(f"{sim.url}/sim/reset").raise_for_status()
    assert sequence() == first
    httpx.post(f"{sim.url}/sim/reset").raise_for_status()
    httpx.post(f"{sim.url}/sim/config", json={"seed": 4}).raise_for_status()
    assert sequence() != first


def test_cut_stream_drops_connection_and_bills_what_was_sent(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(cut_stream_rate=1.0)
    lines: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
        "POST", f"{sim.url}/v1/chat/completions", headers=AUTH, timeout=5,
        json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
    ) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        lines.extend(line for line in response.iter_lines() if line.startswith("data: "))
    assert lines and "data: [DONE]" not in lines
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert not any(c["choices"] and c["choices"][0]["finish_reason"] for c in chunks)
    assert all(c["usage"] is None for c in chunks)
    sent = sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content"))
    assert 0 < sent < 20
    [record] = httpx.get(f"{sim.url}/sim/usage").json()["data"]
    assert record["request_id"] == request_id and record["output_tokens"] == sent
    assert httpx.get(f"{sim.url}/sim/stats").json()["cut_streams"] == 1


def test_malformed_body_is_200_but_not_json(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(malformed_rate=1.0)
    response = post(sim, CHAT)
    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.content)
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="sk-test-key", max_retries=0)
    with pytest.raises((openai.APIError, json.JSONDecodeError, ValueError)):
        client.chat.completions.create(model="sim-small", messages=HELLO)


def test_latency_then_client_gives_up_counts_abort(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(latency_s=5.0)
    with pytest.raises(httpx.ReadTimeout):
        post(sim, CHAT, timeout=0.3)
    wait_until(lambda: httpx.get(f"{sim.url}/sim/stats").json()["aborted"] == 1, what="abort counted")
    assert httpx.get(f"{sim.url}/sim/usage").json()["data"] == []


def test_stream_disconnect_counts_abort_and_bills_partial(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(token_delay_s=0.05, output_tokens=100)
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", headers=AUTH, timeout=5,
                      json={**CHAT, "stream": True}) as response:
        seen = 0
        for line in response.iter_lines():
            seen += '"content":" ' in line
            if seen == 3:
                break
    wait_until(lambda: httpx.get(f"{sim.url}/sim/stats").json()["aborted"] == 1, what="abort counted")
    stats = httpx.get(f"{sim.url}/sim/stats").json()
    assert stats["active_streams"] == 0
    [record] = httpx.get(f"{sim.url}/sim/usage").json()["data"]
    assert 3 <= record["output_tokens"] < 100
