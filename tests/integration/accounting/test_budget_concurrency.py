"""Budgets hold under concurrency across replicas: three gateway processes sharing one
ledger (PostgreSQL, or one SQLite file), 60 clients at once, a budget that fits exactly
K requests."""

from __future__ import annotations

import asyncio
import textwrap
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from gateway.accounting.database import normalise_url
from gateway.auth.keys import key_digest, new_api_key
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from gateway.tokens.counting import count_chat_tokens
from tests.support.processes import gateway_processes
from tests.support.servers import run_asgi_in_thread

K = 17
CLIENTS = 60
MAX_TOKENS = 50
MESSAGES = [{"role": "user", "content": "Count the sheep in this meadow, please."}]
INPUT_PICO, OUTPUT_PICO = 150_000, 600_000  # $0.15 and $0.60 per 1M tokens, per token in pico-dollars


def cost_pico() -> int:
    return count_chat_tokens(MESSAGES) * INPUT_PICO + MAX_TOKENS * OUTPUT_PICO


def write_policy(path: Path, hosted: str, capped_key: str, task_key: str) -> None:
    budget = Decimal(K * cost_pico()).scaleb(-12)
    path.write_text(textwrap.dedent(f"""\
        version: 1
        defaults:
          prompt_margin_ratio: 0      # the simulator counts prompts exactly as the gateway does
          prompt_margin_tokens: 0
        upstreams:
          hosted: {{kind: openai, base_url: "{hosted}/v1"}}
        models:
          gpt-4o-mini:
            upstream: hosted
            price: {{input: 0.15, output: 0.60}}
            tokenizer: o200k_base        # what the simulator counts with, by default
            provider_tokenizer: tiktoken
        tenants:
          capped:
            api_keys: ["{key_digest(capped_key)}"]
            budget: {{usd: "{budget}", period: month}}
          agents:
            api_keys: ["{key_digest(task_key)}"]
        """))


async def fire(urls: list[str], key: str, extra_headers: dict[str, str]) -> list[httpx.Response]:
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    headers = {"authorization": f"Bearer {key}", **extra_headers}
    async with httpx.AsyncClient(timeout=60) as client:
        start = asyncio.Event()

        async def one(i: int) -> httpx.Response:
            await start.wait()
            return await client.post(f"{urls[i % len(urls)]}/v1/chat/completions", json=body, headers=headers)

        tasks = [asyncio.create_task(one(i)) for i in range(CLIENTS)]
        start.set()
        return await asyncio.gather(*tasks)


def assert_exactly_k(responses: list[httpx.Response]) -> None:
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert len(ok) == K, f"{len(ok)} succeeded, expected exactly {K}: {[r.text[:200] for r in refused[:3]]}"
    for r in refused:
        assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota", r.text
        assert r.headers["x-should-retry"] == "false"


@pytest.mark.services
@pytest.mark.parametrize("ledger", ["postgresql", "sqlite"])
def test_tenant_and_task_budgets_admit_exactly_k_across_three_replicas(
    tmp_path: Path, redis_prefix: tuple[str, str], request: pytest.FixtureRequest, ledger: str
) -> None:
    # SQLite: three processes on one ledger file, taking turns on its write lock.
    database_url = request.getfixturevalue("postgres_url") if ledger == "postgresql" else f"sqlite:///{tmp_path / 'ledger.db'}"
    capped, agents = new_api_key(), new_api_key()
    with run_asgi_in_thread(create_hosted_app(HostedSimConfig())) as hosted:
        policy = tmp_path / "policy.yaml"
        write_policy(policy, hosted, capped, agents)
        env = {"DATABASE_URL": database_url, "REDIS_URL": redis_prefix[0], "GATEWAY_VAR_DIR": str(tmp_path / "var")}
        with gateway_processes(3, policy, env, tmp_path) as gateways:
            urls = [g.url for g in gateways]
            assert_exactly_k(asyncio.run(fire(urls, capped, {})))

            task = httpx.post(f"{urls[0]}/v1/tasks", headers={"authorization": f"Bearer {agents}"},
                              json={"budget_usd": str(Decimal(K * cost_pico()).scaleb(-12))})
            assert task.status_code == 201, task.text
            task_id = task.json()["id"]
            assert_exactly_k(asyncio.run(fire(urls, agents, {"x-task-id": task_id})))

            books = httpx.get(f"{urls[2]}/v1/tasks/{task_id}", headers={"authorization": f"Bearer {agents}"}).json()
            assert Decimal(books["budget"]["settled_usd"]) == Decimal(K * cost_pico()).scaleb(-12)
            assert Decimal(books["budget"]["reserved_usd"]) == 0 and Decimal(books["budget"]["remaining_usd"]) == 0
            assert sum(1 for e in books["events"] if e["status"] == "ok") == K

    engine = create_engine(normalise_url(database_url))
    with engine.connect() as conn:
        budgets = conn.execute(text("SELECT scope, limit_pico, reserved_pico, spent_pico FROM budgets")).all()
        open_holds = conn.execute(text("SELECT count(*) FROM reservations WHERE state = 'reserved'")).scalar_one()
    engine.dispose()
    assert open_holds == 0, "every reservation must have ended"
    for scope, limit, reserved, spent in budgets:
        assert reserved == 0 and spent == limit == K * cost_pico(), (scope, limit, reserved, spent)
