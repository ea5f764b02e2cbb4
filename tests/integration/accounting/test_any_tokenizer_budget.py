"""A budget no tokenizer can overspend: a provider whose tokenizer counts twice what
tiktoken does, a tenant budget that fits 10.5 of its calls, three gateway replicas on
one PostgreSQL ledger and one Redis, 60 clients at once and then one at a time until
refused. The provider's bill stays within the budget and the ledger agrees with it to
the pico-dollar; what is left is less than one call's hold, so the gateway refused only
what might not have fit."""

from __future__ import annotations

import asyncio
import textwrap
import time
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from gateway.accounting.database import normalise_url
from gateway.auth.keys import key_digest, new_api_key
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from gateway.tokens.counting import count_chat_tokens
from gateway.tokens.prompt_bound import prompt_tokens_bound
from tests.support.processes import gateway_processes
from tests.support.servers import run_asgi_in_thread

CLIENTS = 60
MAX_TOKENS = 30
TOKENS_PER_TIKTOKEN = 2
MESSAGES = [{"role": "user", "content": "Summarize the minutes of the harbour board meeting: dredging the north channel, "
                                        "the new ferry timetable and the budget for the lighthouse repairs. " * 6}]
BODY = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "ignore_eos": True}
INPUT_PICO, OUTPUT_PICO = 150_000, 600_000  # the policy's $0.15 and $0.60 per 1M tokens, per token
CALL_PICO = TOKENS_PER_TIKTOKEN * count_chat_tokens(MESSAGES) * INPUT_PICO + MAX_TOKENS * OUTPUT_PICO  # what the provider bills
BUDGET_PICO = CALL_PICO * 21 // 2  # 10.5 calls
HOLD_PICO = prompt_tokens_bound("chat.completions", BODY) * INPUT_PICO + MAX_TOKENS * OUTPUT_PICO  # what a call holds


def write_policy(path: Path, hosted: str, key: str) -> None:
    path.write_text(textwrap.dedent(f"""\
        version: 1
        upstreams:
          hosted: {{kind: openai, base_url: "{hosted}/v1"}}
        models:
          gpt-4o-mini:                  # its provider's tokenizer is not declared: unknown
            upstream: hosted
            price: {{input: 0.15, output: 0.60}}
        tenants:
          acme:
            api_keys: ["{key_digest(key)}"]
            budget: {{usd: "{Decimal(BUDGET_PICO).scaleb(-12)}", period: month}}
        """))


async def at_once(urls: list[str], key: str) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        start = asyncio.Event()

        async def one(i: int) -> httpx.Response:
            await start.wait()
            return await client.post(f"{urls[i % len(urls)]}/v1/chat/completions", json=BODY,
                                     headers={"authorization": f"Bearer {key}"})

        tasks = [asyncio.create_task(one(i)) for i in range(CLIENTS)]
        start.set()
        return await asyncio.gather(*tasks)


def one_at_a_time_until_refused(url: str, key: str) -> list[httpx.Response]:
    replies: list[httpx.Response] = []
    with httpx.Client(timeout=60) as client:
        while not replies or replies[-1].status_code == 200:
            assert len(replies) <= 11, "more calls than the budget pays for"
            replies.append(client.post(f"{url}/v1/chat/completions", json=BODY, headers={"authorization": f"Bearer {key}"}))
    return replies


def assert_answered_or_refused(replies: list[httpx.Response]) -> None:
    for r in replies:
        if r.status_code != 200:
            assert r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota", r.text
            assert r.headers["x-should-retry"] == "false"


def provider_bill_pico(hosted: str) -> tuple[int, int]:
    """(pico-dollars, calls) from the provider's usage report, at the model's price."""
    page = httpx.get(f"{hosted}/v1/organization/usage/completions", headers={"authorization": "Bearer sk-admin"},
                     params={"start_time": int(time.time()) - 3600, "bucket_width": "1d"}).json()
    results = [r for bucket in page["data"] for r in bucket["results"]]
    assert all(r["input_cached_tokens"] == 0 for r in results)  # prompt caching is off: one input price
    bill = sum(r["input_tokens"] * INPUT_PICO + r["output_tokens"] * OUTPUT_PICO for r in results)
    return bill, sum(r["num_model_requests"] for r in results)


@pytest.mark.services
def test_a_tokenizer_that_counts_twice_as_many_tokens_cannot_overspend_a_budget(
    tmp_path: Path, redis_prefix: tuple[str, str], postgres_url: str
) -> None:
    assert HOLD_PICO > CALL_PICO, "the hold bounds what the provider bills"
    key = new_api_key()
    config = HostedSimConfig(tokens_per_tiktoken=float(TOKENS_PER_TIKTOKEN), prompt_caching=False)
    with run_asgi_in_thread(create_hosted_app(config)) as hosted:
        policy = tmp_path / "policy.yaml"
        write_policy(policy, hosted, key)
        env = {"DATABASE_URL": postgres_url, "REDIS_URL": redis_prefix[0], "GATEWAY_REDIS_PREFIX": redis_prefix[1],
               "GATEWAY_VAR_DIR": str(tmp_path / "var")}
        with gateway_processes(3, policy, env, tmp_path) as gateways:
            burst = asyncio.run(at_once([g.url for g in gateways], key))
            tail = one_at_a_time_until_refused(gateways[0].url, key)
        bill, calls = provider_bill_pico(hosted)

    replies = burst + tail
    assert_answered_or_refused(replies)
    answered = [r for r in replies if r.status_code == 200]
    assert answered and tail[-1].status_code == 429
    assert calls == len(answered) and bill == calls * CALL_PICO, "the provider billed each answered call, at 2x tiktoken"
    assert bill <= BUDGET_PICO, f"billed {Decimal(bill).scaleb(-12)} USD on a {Decimal(BUDGET_PICO).scaleb(-12)} USD budget"
    assert sum(Decimal(r.headers["x-gateway-cost-usd"]) for r in answered) == Decimal(bill).scaleb(-12)

    engine = create_engine(normalise_url(postgres_url))
    with engine.connect() as conn:
        limit, reserved, spent = conn.execute(text("SELECT limit_pico, reserved_pico, spent_pico FROM budgets")).one()
        booked = conn.execute(text("SELECT sum(cost_pico), sum(prompt_tokens) FROM usage_events WHERE status = 'ok'")).one()
        open_holds = conn.execute(text("SELECT count(*) FROM reservations WHERE state = 'reserved'")).scalar_one()
    engine.dispose()
    assert (limit, reserved, open_holds) == (BUDGET_PICO, 0, 0)
    assert spent == booked[0] == bill, "the ledger agrees with the provider's bill"
    assert booked[1] == calls * TOKENS_PER_TIKTOKEN * count_chat_tokens(MESSAGES), "booked at the provider's count"
    assert limit - spent < HOLD_PICO, "refused only when a call's hold no longer fit"
