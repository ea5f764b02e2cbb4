"""What the gateway's operational endpoints show to whoever can reach them: /metrics
names tenants only to a scraper with the metrics key, and /readyz says which component
is not ready without showing any path or address."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.auth.keys import new_api_key
from gateway.settings import Settings
from gateway.sim.hosted import create_hosted_app
from tests.conftest import POSTGRES_DSN
from tests.support.policies import single_model_policy
from tests.support.processes import free_port
from tests.support.servers import run_asgi_in_thread
from tests.support.stack import METRICS_KEY, Stack, running_stack

HELLO: Any = [{"role": "user", "content": "hello"}]


def answer_one_call_per_tenant(stack: Stack) -> None:
    for key in (stack.key, stack.other_key):
        openai.OpenAI(base_url=stack.gateway, api_key=key, max_retries=0).chat.completions.create(
            model="gpt-4o-mini", messages=HELLO)


def answered(text: str) -> float:
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "gateway_requests_total" and s.labels.get("status") == "ok")


def test_metrics_without_the_key_are_refused_and_with_it_name_tenants(stack: Stack) -> None:
    answer_one_call_per_tenant(stack)
    for authorization in (None, "Bearer wrong-key", f"Basic {METRICS_KEY}", f"Bearer {METRICS_KEY}x"):
        headers = {"authorization": authorization} if authorization else {}
        refused = httpx.get(f"{stack.root}/metrics", headers=headers)
        assert refused.status_code == 401, authorization
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert "acme" not in refused.text and "gateway_requests" not in refused.text
    text = stack.metrics()
    assert 'tenant="acme"' in text and 'tenant="globex"' in text


def test_metrics_without_a_key_configured_show_totals_and_no_tenant(tmp_path: Path) -> None:
    with running_stack(tmp_path, metrics_key=None) as stack:
        answer_one_call_per_tenant(stack)
        for authorization in ({}, {"authorization": "Bearer anything"}):
            scraped = httpx.get(f"{stack.root}/metrics", headers=authorization)
            assert scraped.status_code == 200
            text = scraped.text
            assert "tenant" not in text and "acme" not in text and "globex" not in text
            assert answered(text) == 2, "both tenants' calls, summed"
            assert "process_resident_memory_bytes" in text


def test_readiness_names_no_path(stack: Stack) -> None:
    ready = httpx.get(f"{stack.root}/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    checks = ready.json()["checks"]
    assert set(checks) == {"policy", "ledger", "redis"} and all(c["ok"] for c in checks.values())
    assert "/" not in ready.text and stack.policy_path.name not in ready.text and "ledger.db" not in ready.text


@pytest.mark.services
def test_readiness_says_which_component_is_down_without_its_address(tmp_path: Path, postgres_url: str) -> None:
    key = new_api_key()
    dead_redis_port = free_port()
    database = postgres_url.rsplit("/", 1)[1]
    with run_asgi_in_thread(create_hosted_app()) as hosted:
        policy = tmp_path / "policy.yaml"
        policy.write_text(single_model_policy(hosted, {"acme": (key, "")}))
        settings = Settings(gateway_policy=policy, gateway_var_dir=tmp_path / "var", database_url=postgres_url,
                            redis_url=f"redis://:hunter2@127.0.0.1:{dead_redis_port}/0", gateway_sweep_interval_s=3600)
        with run_asgi_in_thread(create_app(settings)) as gateway:
            with psycopg.connect(f"{POSTGRES_DSN}/test", autocommit=True) as admin:
                admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
            try:
                ready = httpx.get(f"{gateway}/readyz", timeout=30)
            finally:
                with psycopg.connect(f"{POSTGRES_DSN}/test", autocommit=True) as admin:
                    admin.execute(f'CREATE DATABASE "{database}"')  # for the fixture to drop
    assert ready.status_code == 503 and ready.json()["status"] == "not ready"
    checks = ready.json()["checks"]
    assert checks["policy"]["ok"] is True
    assert checks["ledger"]["ok"] is False and checks["redis"]["ok"] is False
    assert checks["ledger"]["detail"].startswith("not usable: ") and checks["redis"]["detail"].startswith("not usable: ")
    for leaked in ("127.0.0.1", "5432", str(dead_redis_port), database, "hunter2", str(tmp_path), "/"):
        assert leaked not in ready.text, leaked
