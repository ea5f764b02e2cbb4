"""A running stack for end-to-end tests: both simulators and a gateway, each a real
HTTP server on its own loopback port, with a fresh policy and keys."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.app import create_app
from gateway.auth.keys import key_digest, new_api_key
from gateway.settings import Settings
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from gateway.sim.vllm import VllmSimConfig, create_vllm_app
from tests.support.servers import run_asgi_in_thread

UPSTREAM_KEY = "sk-upstream-secret-0123456789"
ADMIN_KEY = "admin-test-key-42"
METRICS_KEY = "metrics-test-key-7"


@dataclass
class Stack:
    gateway: str  # base URL ending in /v1
    hosted: str  # simulator root URL (no /v1)
    vllm: str
    key: str  # tenant `acme`
    other_key: str  # tenant `globex`
    policy_path: Path
    var_dir: Path

    @property
    def root(self) -> str:
        return self.gateway.removesuffix("/v1")

    def metrics(self) -> str:
        """What Prometheus scrapes, with the stack's metrics key (every series)."""
        response = httpx.get(f"{self.root}/metrics", headers={"authorization": f"Bearer {METRICS_KEY}"}, timeout=10)
        response.raise_for_status()
        return response.text


def policy_text(hosted: str, vllm: str, acme_digest: str, globex_digest: str) -> str:
    return textwrap.dedent(f"""\
        version: 1
        defaults:
          max_output_tokens: 256
          request_timeout_s: 30
          max_body_bytes: 65536
        upstreams:
          hosted:
            kind: openai
            base_url: {hosted}/v1
            api_key_env: GATEWAY_TEST_UPSTREAM_KEY
            timeout_s: 20
          pool:
            kind: vllm
            replicas: [{vllm}/v1]
        models:
          gpt-4o-mini:
            upstream: hosted
            price: {{input: 0.15, cached_input: 0.075, output: 0.60}}
          sim-large:
            upstream: hosted
            price: {{input: 2.50, cached_input: 1.25, output: 10.00}}
          text-embedding-3-small:
            upstream: hosted
            price: {{input: 0.02, output: 0}}
          pool-model:
            upstream: pool
            price: {{input: 0.05, cached_input: 0.01, output: 0.20}}
        tenants:
          acme:
            api_keys: ["{acme_digest}"]
          globex:
            api_keys: ["{globex_digest}"]
            models: [gpt-4o-mini]
        routes:
          auto:
            chain: [gpt-4o-mini, sim-large]
        """)


@contextlib.contextmanager
def running_stack(tmp_path: Path,
                  hosted_config: HostedSimConfig | None = None,
                  vllm_config: VllmSimConfig | None = None,
                  poll_s: float = 0.05,
                  edit_policy: Callable[[str], str] | None = None,
                  metrics_key: str | None = METRICS_KEY) -> Iterator[Stack]:
    import os

    os.environ["GATEWAY_TEST_UPSTREAM_KEY"] = UPSTREAM_KEY
    key, other = new_api_key(), new_api_key()
    with run_asgi_in_thread(create_hosted_app(hosted_config or HostedSimConfig())) as hosted, \
            run_asgi_in_thread(create_vllm_app(vllm_config or VllmSimConfig())) as vllm:
        policy = tmp_path / "policy.yaml"
        text = policy_text(hosted, vllm, key_digest(key), key_digest(other))
        policy.write_text(edit_policy(text) if edit_policy else text)
        settings = Settings(gateway_policy=policy, gateway_var_dir=tmp_path / "var", gateway_policy_poll_s=poll_s,
                            gateway_admin_key=ADMIN_KEY, gateway_metrics_key=metrics_key, database_url=f"sqlite:///{tmp_path / 'var' / 'ledger.db'}")
        with run_asgi_in_thread(create_app(settings)) as gateway:
            yield Stack(gateway + "/v1", hosted, vllm, key, other, policy, tmp_path / "var")
