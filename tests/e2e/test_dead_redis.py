"""With Redis gone: requests whose limits cannot be checked get a clear 503, the cache
is skipped rather than failing answers, and /readyz says what is wrong."""

from __future__ import annotations

from pathlib import Path

import httpx

from gateway.app import create_app
from gateway.auth.keys import new_api_key
from gateway.settings import Settings
from gateway.sim.hosted import create_hosted_app
from tests.support.policies import single_model_policy
from tests.support.processes import free_port
from tests.support.servers import run_asgi_in_thread


def test_dead_redis_gives_precise_errors_and_loses_nothing(tmp_path: Path) -> None:
    limited, free = new_api_key(), new_api_key()
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with run_asgi_in_thread(create_hosted_app()) as hosted:
        policy = tmp_path / "policy.yaml"
        policy.write_text(single_model_policy(hosted, {"limited": (limited, "limits: {rpm: 100}"), "free": (free, "")}))
        settings = Settings(gateway_policy=policy, gateway_var_dir=tmp_path / "var", redis_url=dead,
                            database_url=f"sqlite:///{tmp_path / 'ledger.db'}")
        with run_asgi_in_thread(create_app(settings)) as gateway:
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}

            refused = httpx.post(f"{gateway}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {limited}"}, timeout=30)
            assert refused.status_code == 503
            assert "Redis" in refused.json()["error"]["message"] and refused.headers["x-should-retry"] == "true"

            served = httpx.post(f"{gateway}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {free}"}, timeout=30)
            assert served.status_code == 200 and served.json()["choices"][0]["message"]["content"]

            ready = httpx.get(f"{gateway}/readyz", timeout=30)
            assert ready.status_code == 503 and ready.json()["checks"]["redis"]["ok"] is False
