"""When a model's upstream keeps failing the gateway retries within its budget and
then fails over to the model's listed fallback; errors retrying cannot fix are not
retried at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import sim_config, sim_stats
from tests.support.stack import running_stack

RETRY = "  retry: {max_attempts: 2, base_s: 0.01, cap_s: 0.05}\n"
EXTRA_MODELS = """\
  resilient:
    upstream: hosted
    upstream_model: gpt-4o-mini
    price: {input: 0.15, output: 0.60}
    fallbacks: [pool-model]
  misnamed:
    upstream: hosted
    upstream_model: no-such-model-upstream
    price: {input: 0.15, output: 0.60}
"""


def edit(text: str) -> str:
    return text.replace("defaults:\n", "defaults:\n" + RETRY, 1).replace("tenants:\n", EXTRA_MODELS + "tenants:\n", 1)


def test_failover_to_fallback_and_no_retry_of_hopeless_errors(tmp_path: Path) -> None:
    with running_stack(tmp_path, edit_policy=edit) as stack:
        def chat(model: str) -> httpx.Response:
            return httpx.post(f"{stack.gateway}/chat/completions", headers={"authorization": f"Bearer {stack.key}"}, timeout=30,
                              json={"model": model, "messages": [{"role": "user", "content": "hello"}]})

        sim_config(stack.hosted, fail_5xx_rate=1.0)
        before: Any = sim_stats(stack.hosted)["requests"]
        r = chat("resilient")
        assert r.status_code == 200, r.text
        assert (r.headers["x-gateway-model"], r.headers["x-gateway-upstream"]) == ("pool-model", "pool")
        assert sim_stats(stack.hosted)["requests"] == before + 2, "two attempts on the failing upstream, then fail over"
        sim_config(stack.hosted, fail_5xx_rate=0.0)

        before = sim_stats(stack.hosted)["requests"]
        missing = chat("misnamed")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        assert sim_stats(stack.hosted)["requests"] == before + 1, "a 404 from the upstream is not retried"


def test_pool_requests_spread_over_replicas(tmp_path: Path) -> None:
    from gateway.sim.vllm import VllmSimConfig, create_vllm_app
    from tests.support.servers import run_asgi_in_thread

    second = create_vllm_app(VllmSimConfig())
    with run_asgi_in_thread(second) as second_url:
        def two_replicas(text: str) -> str:
            return text.replace("replicas: [", f"replicas: [{second_url}/v1, ", 1)

        with running_stack(tmp_path, edit_policy=two_replicas) as stack:
            for i in range(10):
                r = httpx.post(f"{stack.gateway}/chat/completions", headers={"authorization": f"Bearer {stack.key}"}, timeout=30,
                               json={"model": "pool-model", "messages": [{"role": "user", "content": f"spread {i}"}]})
                assert r.status_code == 200
            first: Any = sim_stats(stack.vllm)["requests"]
            assert first >= 3 and second.stats.requests >= 3, (first, second.stats.requests)


def test_exhausted_provider_limit_delays_the_next_request_only_until_it_fits(tmp_path: Path) -> None:
    import time

    from gateway.sim.hosted import HostedSimConfig

    with running_stack(tmp_path, hosted_config=HostedSimConfig(rpm=10)) as stack:
        took = []
        for i in range(11):
            start = time.monotonic()
            r = httpx.post(f"{stack.gateway}/chat/completions", headers={"authorization": f"Bearer {stack.key}"}, timeout=60,
                           json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"paced {i}"}]})
            took.append(time.monotonic() - start)
            assert r.status_code == 200, r.text
        # The 11th must wait for one request's worth (60 s / 10), not for the whole minute.
        assert took[-1] < 20, f"the 11th request waited {took[-1]:.1f}s"
        assert sim_stats(stack.hosted)["by_status"].get("429", 0) <= 1  # type: ignore[union-attr]
