"""Provider 429 storms absorbed inside the deadline, deadlines that stop waiting and
close the upstream, and clients that hang up mid-stream."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from gateway.sim.hosted import HostedSimConfig
from gateway.tokens.counting import count_chat_tokens, count_text_tokens
from tests.e2e.conftest import sim_config, sim_stats
from tests.e2e.test_openai_sdk import wait_until
from tests.support.stack import ADMIN_KEY, Stack, running_stack

REQUESTS = 300
RETRY = "  retry: {max_attempts: 5, budget_ratio: 0.6, base_s: 0.05, cap_s: 0.5}\n"


@pytest.fixture
def storm_stack(tmp_path: Path) -> Iterator[Stack]:
    hosted = HostedSimConfig(fail_429_rate=0.3, retry_after_s=0.05)
    with running_stack(tmp_path, hosted_config=hosted, edit_policy=lambda t: t.replace("defaults:\n", "defaults:\n" + RETRY, 1)) as s:
        yield s


def test_429_storm_is_absorbed_within_deadline_and_retry_budget(storm_stack: Stack) -> None:
    stack = storm_stack

    async def go() -> list[int]:
        sem = asyncio.Semaphore(20)
        async with httpx.AsyncClient(timeout=30) as client:
            async def one(i: int) -> int:
                async with sem:
                    r = await client.post(f"{stack.gateway}/chat/completions",
                                          json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"storm {i}"}]},
                                          headers={"authorization": f"Bearer {stack.key}", "x-request-timeout": "10"})
                    return r.status_code
            return await asyncio.gather(*(one(i) for i in range(REQUESTS)))

    statuses = asyncio.run(go())
    ok = statuses.count(200)
    assert ok >= 0.99 * REQUESTS, f"only {ok}/{REQUESTS} succeeded: {sorted(set(statuses))}"
    stats: Any = sim_stats(stack.hosted)
    attempts = stats["requests"]
    assert stats["by_status"].get("429", 0) > 0.2 * REQUESTS, "the simulator should really have sent a storm"
    assert attempts <= REQUESTS * 1.6 + 3, f"{attempts} upstream attempts overran the retry budget"
    engine = create_engine(f"sqlite:///{stack.var_dir / 'ledger.db'}")
    # Settlements commit just after their answers: wait for the last ones, then compare.
    wait_until(lambda: _count(engine, "SELECT count(*) FROM usage_events") >= attempts)
    booked = _count(engine, "SELECT count(*) FROM usage_events")
    rate_limited = _count(engine, "SELECT count(*) FROM usage_events WHERE http_status = 429")
    engine.dispose()
    assert booked == attempts, "every upstream attempt, failed ones included, is booked"
    assert rate_limited == stats["by_status"]["429"]


def test_deadline_mid_stream_stops_waiting_and_aborts_the_pool(fresh_stack: Stack) -> None:
    sim_config(fresh_stack.vllm, decode_s_per_token=0.1)
    before = int(sim_stats(fresh_stack.vllm)["aborted"])  # type: ignore[call-overload]
    client = openai.OpenAI(base_url=fresh_stack.gateway, api_key=fresh_stack.key, max_retries=0)
    stream = client.chat.completions.create(model="pool-model", messages=[{"role": "user", "content": "long story"}], stream=True,
                                            max_tokens=100, extra_headers={"x-request-timeout": "0.6"})
    received = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            received.append(chunk)
    assert received, "the answer had started streaming before the deadline"
    assert "deadline" in str(info.value)
    wait_until(lambda: int(sim_stats(fresh_stack.vllm)["aborted"]) > before)  # type: ignore[call-overload]


@pytest.mark.parametrize("budgeted", [True, False], ids=["budget", "no-budget"])
def test_a_stream_cancelled_after_k_chunks_is_booked_at_prompt_plus_relayed_output(tmp_path: Path, budgeted: bool) -> None:
    budget = lambda t: t.replace('\n  globex:', '\n    budget: {usd: "10.00", period: month}\n  globex:', 1)  # noqa: E731
    with running_stack(tmp_path, edit_policy=budget if budgeted else None) as stack:
        _cancel_after(stack, chunks=5)


def _cancel_after(stack: Stack, chunks: int) -> None:
    sim_config(stack.vllm, decode_s_per_token=0.05)
    before = int(sim_stats(stack.vllm)["aborted"])  # type: ignore[call-overload]
    messages = [{"role": "user", "content": "tell me a long story about the sea"}]
    client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
    stream = client.chat.completions.create(model="pool-model", messages=messages, stream=True, max_tokens=200)  # type: ignore[call-overload]
    text_read = ""
    for n, chunk in enumerate(stream):
        text_read += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        if n == chunks:
            break
    stream.close()  # the client hangs up after k chunks
    wait_until(lambda: int(sim_stats(stack.vllm)["aborted"]) > before)  # type: ignore[call-overload]
    engine = create_engine(f"sqlite:///{stack.var_dir / 'ledger.db'}")
    wait_until(lambda: _status_count(engine, "cancelled") == 1)
    with engine.connect() as conn:
        event = conn.execute(text("SELECT estimated, usage_known, prompt_tokens, completion_tokens, cost_pico, reservation_id"
                                  " FROM usage_events WHERE status = 'cancelled'")).one()
        hold = conn.execute(text("SELECT state, settled_pico FROM reservations WHERE id = :id"), {"id": event.reservation_id}).one()
    engine.dispose()
    read_tokens = count_text_tokens(text_read)
    assert event.estimated and not event.usage_known
    assert event.prompt_tokens == count_chat_tokens(messages)  # the prompt, counted
    # What reached the client: at least what it read, and at most a few tokens relayed while it hung up.
    assert read_tokens <= event.completion_tokens <= read_tokens + 5
    assert event.cost_pico > 0
    assert (hold.state, hold.settled_pico) == ("settled", event.cost_pico)  # charged the estimate, the rest released


def test_reconciliation_explains_what_a_cancelled_stream_s_estimate_missed(tmp_path: Path) -> None:
    with running_stack(tmp_path, hosted_config=HostedSimConfig(token_delay_s=0.05, output_tokens=200)) as stack:
        client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
        stream = client.chat.completions.create(model="gpt-4o-mini", stream=True,  # type: ignore[call-overload]
                                                messages=[{"role": "user", "content": "a long answer, please"}])
        for n, _ in enumerate(stream):
            if n == 5:
                break
        stream.close()  # the provider bills what it generated until it noticed
        engine = create_engine(f"sqlite:///{stack.var_dir / 'ledger.db'}")
        wait_until(lambda: _status_count(engine, "cancelled") == 1)
        engine.dispose()
        report = httpx.get(f"{stack.gateway.removesuffix('/v1')}/admin/reconcile", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                           params={"provider": "hosted", "since": datetime.now(UTC).date().isoformat()}, timeout=30)
    assert report.status_code == 200, report.text
    [row] = report.json()["rows"]
    reasons = {r["reason"]: r for r in row["reasons"]}
    assert set(reasons) <= {"cancelled"}, row  # the estimate's error, and nothing else, explains the difference
    explained = sum(int(r["cost_pico"]) for r in row["reasons"])
    assert explained == int(row["difference"]["cost_pico"]), row


def test_a_non_streamed_client_that_hangs_up_aborts_the_pool_request(fresh_stack: Stack) -> None:
    sim_config(fresh_stack.vllm, decode_s_per_token=0.05)  # 200 tokens: 10 s to answer
    before = int(sim_stats(fresh_stack.vllm)["aborted"])  # type: ignore[call-overload]
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        httpx.post(f"{fresh_stack.gateway}/chat/completions", headers={"authorization": f"Bearer {fresh_stack.key}"},
                   json={"model": "pool-model", "messages": [{"role": "user", "content": "go"}], "max_tokens": 200}, timeout=0.5)
    wait_until(lambda: int(sim_stats(fresh_stack.vllm)["aborted"]) > before)  # long before the 10 s answer
    engine = create_engine(f"sqlite:///{fresh_stack.var_dir / 'ledger.db'}")
    wait_until(lambda: _status_count(engine, "cancelled") == 1)
    engine.dispose()


def _count(engine: Any, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def _status_count(engine: Any, status: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM usage_events WHERE status = :s"), {"s": status}).scalar_one())
