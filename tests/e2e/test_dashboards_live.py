"""The Grafana dashboards against the real thing: every PromQL query of the ops
dashboard, asked of a real Prometheus (Debian's package) that scrapes a gateway under
load and its vLLM pool, and every SQL query of the finance dashboard, run on the same
gateway's PostgreSQL ledger, returns data."""

from __future__ import annotations

import contextlib
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from gateway.app import create_app
from gateway.auth.keys import key_digest, new_api_key
from gateway.settings import Settings
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from gateway.sim.vllm import VllmSimConfig, create_vllm_app
from tests.support.processes import free_port
from tests.support.servers import run_asgi_in_thread
from tests.support.system_programs import debian_program
from tests.unit.test_deploy_files import expand_grafana_sql, prometheus_exprs, sql_targets

METRICS_KEY = "metrics-live-test"
RATE_WINDOW = "30s"
LOAD_S = 8.0
# A shared prefix longer than a few 16-token blocks, so the pool's prefix cache has hits.
PREFIX = "You are a careful assistant for the accounts team. " * 12


def policy_text(hosted: str, vllm: str, acme: str, globex: str, comment: str = "") -> str:
    return textwrap.dedent(f"""\
        version: 1
        {comment}
        upstreams:
          hosted: {{kind: openai, base_url: "{hosted}/v1"}}
          pool: {{kind: vllm, replicas: ["{vllm}/v1"]}}
        models:
          gpt-4o-mini: {{upstream: hosted, price: {{input: 0.15, cached_input: 0.075, output: 0.60}}}}
          sim-large: {{upstream: hosted, price: {{input: 2.50, cached_input: 1.25, output: 10.00}}}}
          pool-model: {{upstream: pool, price: {{input: 0.05, cached_input: 0.01, output: 0.20}}}}
        tenants:
          acme:
            api_keys: ["{key_digest(acme)}"]
            budget: {{usd: "1000", period: month}}
            limits: {{tpm: 1000000000}}      # token limits: prompts are counted, so the estimate panel has data
          globex:
            api_keys: ["{key_digest(globex)}"]
        """)


@contextlib.contextmanager
def prometheus(tmp_path: Path, gateway: str, vllm: str) -> Iterator[str]:
    binary = debian_program("prometheus", "prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(textwrap.dedent(f"""\
        global: {{scrape_interval: 1s, evaluation_interval: 1s}}
        scrape_configs:
          - job_name: gateway
            authorization: {{type: Bearer, credentials: {METRICS_KEY}}}
            static_configs: [{{targets: ["{gateway.removeprefix('http://')}"]}}]
          - job_name: vllm
            static_configs: [{{targets: ["{vllm.removeprefix('http://')}"], labels: {{pool: sim}}}}]
        """))
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 30, f"Prometheus did not start: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


def _ready(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    return False


def wait_for(condition: Any, timeout_s: float, message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.2)


def instant(prometheus_url: str, expr: str, at: float) -> list[dict[str, Any]]:
    reply = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}, timeout=10)
    assert reply.status_code == 200, (expr, reply.text)
    result: list[dict[str, Any]] = reply.json()["data"]["result"]
    return result


def load(gateway: str, acme: str, globex: str, policy: Path, edit: str, seconds: float) -> None:
    """Four clients for `seconds`: hosted and pool models, streamed and not, a few calls
    that fail, and one policy edit half-way (a reload)."""
    stop = time.monotonic() + seconds
    edited = threading.Event()

    def client(n: int) -> None:
        key = acme if n % 2 == 0 else globex
        sdk = openai.OpenAI(base_url=f"{gateway}/v1", api_key=key, max_retries=0)
        i = 0
        while time.monotonic() < stop:
            i += 1
            if n == 0 and not edited.is_set() and time.monotonic() > stop - seconds / 2:
                policy.write_text(edit)
                edited.set()
            messages: Any = [{"role": "system", "content": PREFIX}, {"role": "user", "content": f"question {n}.{i}"}]
            model = ("gpt-4o-mini", "sim-large", "pool-model")[i % 3]
            if i % 7 == 0:
                with contextlib.suppress(openai.NotFoundError):
                    sdk.chat.completions.create(model="no-such-model", messages=messages)
            elif i % 2 == 0:
                for _ in sdk.chat.completions.create(model=model, messages=messages, max_tokens=12, stream=True):
                    pass
            else:
                sdk.chat.completions.create(model=model, messages=messages, max_tokens=12)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(client, range(4)))


@pytest.mark.services
def test_every_dashboard_query_returns_data_from_a_gateway_under_load(tmp_path: Path, postgres_url: str) -> None:
    acme, globex = new_api_key(), new_api_key()
    with run_asgi_in_thread(create_hosted_app(HostedSimConfig(output_tokens=12))) as hosted, \
            run_asgi_in_thread(create_vllm_app(VllmSimConfig(output_tokens=12))) as vllm:
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_text(hosted, vllm, acme, globex))
        settings = Settings(gateway_policy=policy, gateway_var_dir=tmp_path / "var", gateway_policy_poll_s=0.2,
                            gateway_metrics_key=METRICS_KEY, database_url=postgres_url, redis_url=None)
        with run_asgi_in_thread(create_app(settings)) as gateway, prometheus(tmp_path, gateway, vllm) as prom:
            wait_for(lambda: len(instant(prom, "up == 1", time.time())) == 2, 30, "Prometheus does not scrape both targets")
            load(gateway, acme, globex, policy, policy_text(hosted, vllm, acme, globex, "# edited under load"), LOAD_S)
            end = time.time()
            # Every query is asked at `end`: wait for a scrape after it, rather than for a time that might not do.
            wait_for(lambda: any(float(s["value"][1]) > end + 1 for s in instant(prom, "timestamp(up)", time.time())), 30,
                     "no scrape after the load")
            asked = [(where, expr.replace("$__rate_interval", RATE_WINDOW).replace('"$model"', '".*"'))
                     for where, expr in prometheus_exprs() if where.startswith("gateway-ops.json")]
            assert len(asked) >= 28 and any("gateway_cost_usd_total" in expr for _, expr in asked)
            empty = [f"{where}: {expr}" for where, expr in asked if not instant(prom, expr, end)]
            assert not empty, "queries without data:\n" + "\n".join(empty)
            reloads = instant(prom, 'gateway_policy_reloads_total{result="ok"}', end)
            assert reloads and float(reloads[0]["value"][1]) >= 1, "the policy edit under load was reloaded"

    now = datetime.now(UTC)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for where, sql in sql_targets():
            for tenants in (None, ["acme"]):
                rows = conn.execute(expand_grafana_sql(sql, now - timedelta(days=1), now + timedelta(minutes=5), tenants)).fetchall()
                assert rows and any(value is not None for value in rows[0]), f"{where} ({tenants or 'All'}): no data"
