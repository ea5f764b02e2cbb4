"""The vLLM simulator over real sockets: protocol, prefix cache with salts, metrics, aborts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.sim.conftest import RunningVllm, wait_until

HELLO: list[Any] = [{"role": "user", "content": "Say hello"}]
LONG: list[Any] = [{"role": "system", "content": "You answer questions about the fleet. " * 40}, *HELLO]


def chat(sim: RunningVllm, **body: Any) -> httpx.Response:
    return httpx.post(f"{sim.url}/v1/chat/completions", json={"model": "pool-model", "messages": HELLO, **body}, timeout=10)


def stats(sim: RunningVllm) -> dict[str, Any]:
    result: dict[str, Any] = httpx.get(f"{sim.url}/sim/stats").json()
    return result


def metrics(sim: RunningVllm) -> dict[str, float]:
    """Samples by name plus labels other than model_name/engine, e.g. 'vllm:request_success_total{abort}'."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{sim.url}/metrics").text):
        for sample in family.samples:
            extra = ",".join(v for k, v in sorted(sample.labels.items()) if k not in ("model_name", "engine"))
            out[sample.name + (f"{{{extra}}}" if extra else "")] = sample.value
    return out


def test_openai_sdk_against_vllm(start_vllm: Callable[..., RunningVllm]) -> None:
    sim = start_vllm()
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="EMPTY", max_retries=0)
    whole = client.chat.completions.create(model="pool-model", messages=HELLO, extra_body={"top_k": 5, "min_tokens": 2})
    assert whole.choices[0].finish_reason == "stop" and whole.usage is not None
    assert whole.usage.completion_tokens == 20 and whole.usage.prompt_tokens_details is None
    assert stats(sim)["last_body"]["top_k"] == 5, "vLLM-only fields are accepted"
    chunks = list(client.chat.completions.create(model="pool-model", messages=HELLO, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    assert [m.id for m in client.models.list()] == ["pool-model"]


def test_stream_options_present_means_usage_and_continuous_stats(start_vllm: Callable[..., RunningVllm]) -> None:
    sim = start_vllm()
    raw = chat(sim, stream=True, stream_options={}, max_tokens=3).text
    payloads = [line.removeprefix("data: ") for line in raw.split("\n\n") if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]" and json.loads(payloads[-2])["usage"]["completion_tokens"] == 3
    continuous = chat(sim, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}, max_tokens=3).text
    chunks = [json.loads(line.removeprefix("data: ")) for line in continuous.split("\n\n")
              if line.startswith("data: {")]
    assert all("usage" in c for c in chunks)
    assert [c["usage"]["completion_tokens"] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")] == [1, 2, 3]
    no_usage = chat(sim, stream=True, max_tokens=3).text
    assert '"usage"' not in no_usage


def test_prefix_cache_hits_only_within_the_same_salt(start_vllm: Callable[..., RunningVllm]) -> None:
    sim = start_vllm(enable_prompt_tokens_details=True)

    def cached(**body: Any) -> int:
        usage = chat(sim, messages=LONG, **body).json()["usage"]
        details = usage["prompt_tokens_details"]
        return 0 if details is None else int(details["cached_tokens"])

    assert cached(cache_salt="tenant-a") == 0
    hit = cached(cache_salt="tenant-a")
    prompt_tokens = chat(sim, messages=LONG, cache_salt="tenant-z").json()["usage"]["prompt_tokens"]
    assert hit > 0 and hit % 16 == 0 and prompt_tokens - 16 <= hit < prompt_tokens
    assert cached(cache_salt="tenant-b") == 0, "another tenant's salt never shares blocks"
    assert cached() == 0, "no salt is its own namespace too"
    m = metrics(sim)
    assert m["vllm:prefix_cache_hits_total"] == hit
    assert m["vllm:prefix_cache_queries_total"] == 5 * prompt_tokens


def test_cached_tokens_hidden_without_the_flag_but_counted(start_vllm: Callable[..., RunningVllm]) -> None:
    sim = start_vllm()
    chat(sim, messages=LONG)
    assert chat(sim, messages=LONG).json()["usage"]["prompt_tokens_details"] is None
    assert stats(sim)["last_cached_tokens"] > 0 and metrics(sim)["vllm:prefix_cache_hits_total"] > 0


def test_errors_in_vllm_shape(start_vllm: Callable[..., RunningVllm]) -> None:
    sim = start_vllm()
    bad_salt = chat(sim, cache_salt="")
    assert bad_salt.status_code == 400
    assert bad_salt.json() == {"error": {"message": "Parameter 'cache_salt' must be a non-empty string if provided.",
                                         "type": "BadRequestError", "param": None, "code": 400}}
    missing = chat(sim, model="other-model")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    assert missing.json()["error"]["code"] == 404
    too_long = chat(sim, max_tokens=10**6)
    assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]
    assert httpx.get(f"{sim.url}/health").status_code == 200
    assert httpx.get(f"{sim.url}/version").json()["version"].startswith("0.11")


def test_metrics_use_vllm_names_and_labels(start_vllm: Callable[..., RunningVllm]) -> None:
    sim = start_vllm()
    chat(sim)
    chat(sim, max_tokens=2)
    text = httpx.get(f"{sim.url}/metrics").text
    assert 'model_name="pool-model"' in text and 'engine="0"' in text
    m = metrics(sim)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:num_preemptions_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count"):
        assert name in m, name
    assert m["vllm:request_success_total{stop}"] == 1 and m["vllm:request_success_total{length}"] == 1
    assert m["vllm:generation_tokens_total"] == 22
    assert m["vllm:e2e_request_latency_seconds_count"] == 2


def test_cache_config_info_gives_the_kv_geometry_a_router_sizes_its_index_by(start_vllm: Callable[..., RunningVllm]) -> None:
    from gateway.upstreams.pool_metrics import parse_replica_metrics

    sim = start_vllm(num_gpu_blocks=640, block_size=32)
    info = [f for f in text_string_to_metric_families(httpx.get(f"{sim.url}/metrics").text) if f.name == "vllm:cache_config_info"]
    assert len(info) == 1 and info[0].samples[0].value == 1
    labels = info[0].samples[0].labels
    assert (labels["block_size"], labels["num_gpu_blocks"], labels["enable_prefix_caching"]) == ("32", "640", "True")
    parsed = parse_replica_metrics(httpx.get(f"{sim.url}/metrics").text)
    assert (parsed.block_size, parsed.num_gpu_blocks) == (32, 640)
    httpx.post(f"{sim.url}/sim/config", json={"num_gpu_blocks": 128}).raise_for_status()
    assert parse_replica_metrics(httpx.get(f"{sim.url}/metrics").text).num_gpu_blocks == 128


def test_streaming_client_disconnect_aborts_the_request(start_vllm: Callable[..., RunningVllm]) -> None:
    sim = start_vllm(decode_s_per_token=0.05)
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", timeout=10,
                      json={"model": "pool-model", "messages": LONG, "stream": True, "max_tokens": 200}) as response:
        lines = response.iter_lines()  # kept referenced: abandoning the iterator would close the connection
        while '"content":" ' not in next(lines):
            pass
        assert metrics(sim)["vllm:kv_cache_usage_perc"] > 0, "a running request holds KV blocks"
        assert stats(sim)["aborted"] == 0
    wait_until(lambda: stats(sim)["aborted"] == 1, what="abort counted")
    m = metrics(sim)
    assert m["vllm:request_success_total{abort}"] == 1
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0
    assert m["vllm:generation_tokens_total"] < 200


def test_non_streaming_client_timeout_aborts_too(start_vllm: Callable[..., RunningVllm]) -> None:
    sim = start_vllm(decode_s_per_token=0.5)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim.url}/v1/chat/completions", json={"model": "pool-model", "messages": HELLO}, timeout=0.3)
    wait_until(lambda: metrics(sim)["vllm:request_success_total{abort}"] == 1, what="abort counted")
    assert stats(sim)["running"] == 0


def test_max_num_seqs_makes_requests_wait(start_vllm: Callable[..., RunningVllm]) -> None:
    sim = start_vllm(max_num_seqs=1, decode_s_per_token=0.05)  # 1 s per request: arrival jitter cannot matter
    results: list[int] = []

    def one(i: int) -> None:
        results.append(chat(sim, messages=[{"role": "user", "content": f"q{i}"}]).status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: stats(sim)["waiting"] == 2, what="two requests waiting")
    assert metrics(sim)["vllm:num_requests_running"] == 1
    for t in threads:
        t.join(timeout=10)
    assert results == [200, 200, 200]
    m = metrics(sim)
    assert m["vllm:num_requests_waiting"] == 0 and m["vllm:request_queue_time_seconds_sum"] > 1.0


def test_prefill_latency_skips_cached_tokens(start_vllm: Callable[..., RunningVllm]) -> None:
    sim = start_vllm(prefill_s_per_token=0.002)

    def timed() -> float:
        start = time.monotonic()
        chat(sim, messages=LONG, max_tokens=1).raise_for_status()
        return time.monotonic() - start

    cold, warm = timed(), timed()
    assert cold >= 0.3, "a ~300-token prompt at 2 ms/token prefills for over 0.3 s"
    assert warm < cold / 3, "cached blocks are not prefilled again"
