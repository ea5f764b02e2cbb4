"""Stored Responses-API conversations in PostgreSQL: two replicas share them (a turn
answered by one continues on the other), and they survive every replica's restart."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.auth.keys import key_digest, new_api_key
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from tests.support.processes import GatewayProcess, gateway_processes
from tests.support.servers import run_asgi_in_thread

UPSTREAM_KEY = "sk-responses-upstream"


def write_policy(path: Path, hosted: str, key: str, other: str) -> None:
    path.write_text(textwrap.dedent(f"""\
        version: 1
        upstreams:
          hosted: {{kind: openai, base_url: "{hosted}/v1", api_key_env: RESPONSES_UPSTREAM_KEY}}
        models:
          gpt-4o-mini: {{upstream: hosted, price: {{input: 0.15, cached_input: 0.075, output: 0.60}}}}
        tenants:
          acme: {{api_keys: ["{key_digest(key)}"]}}
          globex: {{api_keys: ["{key_digest(other)}"]}}
        """))


def client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=20)


def sent_messages(hosted: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{hosted}/sim/stats", timeout=5).json()["last_body"]
    messages: list[dict[str, Any]] = body["messages"]
    return messages


def test_two_replicas_share_a_conversation_that_survives_restarts(tmp_path: Path, postgres_url: str) -> None:
    key, other = new_api_key(), new_api_key()
    os.environ["RESPONSES_UPSTREAM_KEY"] = UPSTREAM_KEY
    with run_asgi_in_thread(create_hosted_app(HostedSimConfig())) as hosted:
        policy = tmp_path / "policy.yaml"
        write_policy(policy, hosted, key, other)
        env = {"DATABASE_URL": postgres_url, "GATEWAY_VAR_DIR": str(tmp_path / "var")}
        with gateway_processes(2, policy, env, tmp_path) as (a, b):
            one = client(a.url, key).responses.create(model="gpt-4o-mini", input="My name is Ada.")
            two = client(b.url, key).responses.create(model="gpt-4o-mini", input="I live in Paris.", previous_response_id=one.id)
            assert client(a.url, key).responses.retrieve(two.id).output_text == two.output_text
            with pytest.raises(openai.NotFoundError):
                client(b.url, other).responses.retrieve(two.id)
        # Every replica gone: a new one still has the whole conversation.
        restarted = GatewayProcess(policy, env, tmp_path / "gateway-restarted.log")
        restarted.start()
        try:
            c = client(restarted.url, key)
            assert c.responses.retrieve(one.id).output_text == one.output_text
            c.responses.create(model="gpt-4o-mini", input="Where do I live?", previous_response_id=two.id)
            assert sent_messages(hosted) == [
                {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": one.output_text},
                {"role": "user", "content": "I live in Paris."}, {"role": "assistant", "content": two.output_text},
                {"role": "user", "content": "Where do I live?"},
            ]
            c.responses.delete(one.id)
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(one.id)
        finally:
            restarted.stop()
