"""With Redis, gateway replicas share one tenant-scoped cache: an answer cached by one
replica is a hit on another."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.auth.keys import new_api_key
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from tests.support.policies import single_model_policy
from tests.support.processes import gateway_processes
from tests.support.servers import run_asgi_in_thread


@pytest.mark.services
def test_two_replicas_share_the_response_cache_but_not_across_tenants(tmp_path: Path, redis_prefix: tuple[str, str]) -> None:
    acme, globex = new_api_key(), new_api_key()
    sim = create_hosted_app(HostedSimConfig())
    with run_asgi_in_thread(sim) as hosted:
        policy = tmp_path / "policy.yaml"
        policy.write_text(single_model_policy(hosted, {"acme": (acme, ""), "globex": (globex, "")}))
        env = {"REDIS_URL": redis_prefix[0], "GATEWAY_REDIS_PREFIX": redis_prefix[1], "GATEWAY_SECRET": "shared-secret-for-test",
               "DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.db'}", "GATEWAY_VAR_DIR": str(tmp_path / "var")}
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "shared?"}], "temperature": 0}
        with gateway_processes(2, policy, env, tmp_path) as (one, two):
            def ask(url: str, key: str) -> httpx.Response:
                return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=20)

            miss = ask(one.url, acme)
            hit = ask(two.url, acme)
            assert (miss.headers["x-gateway-cache"], hit.headers["x-gateway-cache"]) == ("miss", "hit")
            assert hit.content == miss.content
            assert ask(two.url, globex).headers["x-gateway-cache"] == "miss"
    assert sim.stats.requests == 2
