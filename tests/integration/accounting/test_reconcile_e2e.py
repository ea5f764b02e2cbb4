"""Reconciliation end to end: real requests through a gateway on a real port (the
openai SDK), booked in its SQLite ledger, billed by the hosted simulator, compared with
the simulator's Usage and Costs APIs over HTTP. The simulator is told to bill a request
the gateway never saw and to drop one the gateway booked; finance must see exactly
those two, with the right reasons and amounts, and nothing else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import Engine, text

from gateway.accounting.database import make_engine, migrate
from gateway.accounting.importers import reconcile_upstream, run_reconcile
from gateway.accounting.importers.openai_usage import import_openai_usage
from gateway.accounting.importers.vllm_metrics import scrape, window_rows
from gateway.accounting.reconcile import MATCHED, MISSING_AT_GATEWAY, MISSING_AT_PROVIDER, PRICE_DRIFT, reconcile
from gateway.routing.loader import load_policy_file
from gateway.sim.usage_report import api_key_id
from gateway.upstreams.provider_reports import ProviderReportClient
from tests.support.stack import UPSTREAM_KEY, Stack, running_stack
from tests.unit.accounting.test_reconcile import AT, DAY, POLICY, Ledger, billed

HELLO: Any = [{"role": "user", "content": "Say hello to the gateway"}]
LONGER: Any = [{"role": "user", "content": "Write two sentences about reconciling invoices with a ledger."}]
PROVIDER_KEY_ID = api_key_id(f"Bearer {UPSTREAM_KEY}")  # how the simulator names the gateway's upstream key
INJECTED = {"model": "sim-small", "api_key_id": PROVIDER_KEY_ID, "input_tokens": 1200, "cached_tokens": 200, "output_tokens": 300}
# sim-small's price in the simulator: 0.15 input, 0.075 cached input, 0.60 output (USD per 1M tokens)
INJECTED_COST_PICO = (1000 * 150_000 + 200 * 75_000 + 300 * 600_000)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path) as running:
        yield running


def reconciling_policy(stack: Stack) -> Path:
    """The stack's policy with the provider's id for the hosted upstream's key: a copy,
    so the running gateway does not hot-reload mid-test."""
    original = stack.policy_path.read_text()
    needle = "    api_key_env: GATEWAY_TEST_UPSTREAM_KEY\n"
    assert needle in original
    path = stack.policy_path.with_name("reconcile-policy.yaml")
    path.write_text(original.replace(needle, needle + f"    provider_key_id: {PROVIDER_KEY_ID}\n", 1))
    return path


def ledger_engine(stack: Stack) -> Engine:
    return make_engine(f"sqlite:///{stack.var_dir / 'ledger.db'}")


def wait_for_events(engine: Engine, upstream: str, count: int, deadline_s: float = 10.0) -> list[Any]:
    """The gateway books after it answers; poll (with a deadline) until every attempt is in."""
    query = text("SELECT * FROM usage_events WHERE upstream = :u AND kind = 'model' ORDER BY id")
    deadline = time.monotonic() + deadline_s
    while True:
        with engine.connect() as conn:
            rows = list(conn.execute(query, {"u": upstream}))
        if len(rows) >= count or time.monotonic() > deadline:
            assert len(rows) == count, f"expected {count} booked attempts on {upstream}, found {len(rows)}"
            return rows
        time.sleep(0.05)


def make_requests(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0, timeout=20)
    client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    list(client.chat.completions.create(model="gpt-4o-mini", messages=LONGER, stream=True))
    client.chat.completions.create(model="sim-large", messages=HELLO)
    client.chat.completions.create(model="sim-large", messages=LONGER)
    list(client.chat.completions.create(model="sim-large", messages=HELLO, stream=True))
    client.embeddings.create(model="text-embedding-3-small", input="reconcile me")


def by_model(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["model"]: row for row in report["rows"]}


def omit_one_and_inject_one(stack: Stack, engine: Engine) -> Any:
    """Make the requests, then have the provider drop one sim-large request the gateway
    booked and bill a sim-small one it never saw; returns the dropped ledger row."""
    make_requests(stack)
    events = wait_for_events(engine, "hosted", 6)
    assert all(e.usage_known and e.status == "ok" and e.provider_request_id.startswith("req_") for e in events)
    omitted = next(e for e in events if e.upstream_model == "sim-large" and e.prompt_tokens > 0)
    httpx.post(f"{stack.hosted}/sim/usage/omit", json={"request_id": omitted.provider_request_id}, timeout=5).raise_for_status()
    httpx.post(f"{stack.hosted}/sim/usage/inject", json=INJECTED, timeout=5).raise_for_status()
    return omitted


def assert_only_the_injected_and_omitted_differ(report: dict[str, Any], omitted: Any) -> None:
    rows = by_model(report)
    assert set(rows) == {"gpt-4o-mini", "sim-large", "sim-small", "text-embedding-3-small"}

    # Untouched groups: requests, tokens and the Costs API's dollars agree exactly.
    for model in ("gpt-4o-mini", "text-embedding-3-small"):
        row = rows[model]
        assert row["status"] == MATCHED and row["reasons"] == [], row
        assert row["ledger"] == row["provider"]
        assert row["key_id"] == PROVIDER_KEY_ID
    assert rows["gpt-4o-mini"]["ledger"]["requests"] == 2

    # The request the provider dropped: the ledger has it, the report does not.
    large = rows["sim-large"]
    assert [r["reason"] for r in large["reasons"]] == [MISSING_AT_PROVIDER]
    expected = {"requests": -1, "input_tokens": -omitted.prompt_tokens, "cached_tokens": -omitted.cached_tokens,
                "output_tokens": -omitted.completion_tokens, "cost_pico": -omitted.cost_pico}
    assert {k: large["difference"][k] for k in expected} == expected
    assert {k: large["reasons"][0][k] for k in expected} == expected
    assert large["ledger"]["requests"] == 3 and large["provider"]["requests"] == 2

    # The record the gateway never saw: a whole group only the provider has.
    small = rows["sim-small"]
    assert [r["reason"] for r in small["reasons"]] == [MISSING_AT_GATEWAY]
    assert small["in_ledger"] is False and small["ledger"]["requests"] == 0
    assert (small["provider"]["requests"], small["provider"]["input_tokens"], small["provider"]["output_tokens"]) == (1, 1200, 300)
    assert small["provider"]["cost_pico"] == INJECTED_COST_PICO

    assert report["totals"]["difference"]["cost_pico"] == INJECTED_COST_PICO - omitted.cost_pico
    assert report["totals"][MISSING_AT_GATEWAY]["requests"] == 1 and report["totals"][MISSING_AT_PROVIDER]["requests"] == -1


def test_injected_and_omitted_usage_are_the_only_differences(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    today = datetime.now(UTC).date()
    engine = ledger_engine(stack)
    omitted = omit_one_and_inject_one(stack, engine)
    policy_path = reconciling_policy(stack)

    # The CLI's entry point: text, exit code 1 for "differences found", progress on stderr.
    code, report_text = run_reconcile(str(policy_path), f"sqlite:///{stack.var_dir / 'ledger.db'}", "hosted", today, None, True)
    assert code == 1, report_text
    assert "missing at provider" in report_text and "missing at gateway" in report_text
    assert "sim-small" in report_text and "2 of 4 groups differ." in report_text
    assert "provider rows" in capsys.readouterr().err

    # The admin API's entry point: the same comparison, as JSON.
    report = asyncio.run(reconcile_upstream(engine, load_policy_file(policy_path), "hosted", today))
    assert_only_the_injected_and_omitted_differ(report, omitted)


@pytest.mark.services
def test_a_postgresql_ledger_reconciles_exactly_like_sqlite(tmp_path: Path, postgres_url: str) -> None:
    """The ledger query (joins, GROUP BY on expressions, timestamps) on both databases."""
    reports = []
    for url in (f"sqlite:///{tmp_path / 'ledger.db'}", postgres_url):
        engine = make_engine(url)
        try:
            migrate(engine)
            ledger = Ledger(engine)
            ledger.attempt("r1")
            ledger.attempt("r2", None, attempt=1, status="error")
            ledger.attempt("r2", attempt=2)
            ledger.hold("rsv_p", "r3", "reserved")
            ledger.attempt("r3", None, status="cancelled", reservation="rsv_p")
            ledger.expired("rsv_x", "r4")
            rows = [billed(6, 600, 0, 240)]
            by_day = reconcile(engine, POLICY, "hosted", rows, DAY, DAY + timedelta(days=1)).to_json()
            window = reconcile(engine, POLICY, "hosted", rows, AT - timedelta(minutes=1), AT + timedelta(minutes=1)).to_json()
            reports.append((by_day, window))
        finally:
            engine.dispose()
    assert reports[0] == reports[1]
    [row] = reports[1][0]["rows"]
    assert row["ledger_attempts"] == {"booked": 2, "retried": 1, "pending": 1, "unconfirmed": 1}
    assert [r["reason"] for r in row["reasons"]] == ["pending", "retried", "unconfirmed", "missing at gateway"]


def test_provider_price_change_shows_as_price_drift(stack: Stack) -> None:
    today = datetime.now(UTC).date()
    client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0, timeout=20)
    client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    client.chat.completions.create(model="sim-large", messages=HELLO)
    engine = ledger_engine(stack)
    [mini, _] = wait_for_events(engine, "hosted", 2)
    # The provider now bills gpt-4o-mini output at 0.70 instead of the policy's 0.60.
    prices = {"gpt-4o-mini": [0.15, 0.075, 0.70], "sim-large": [2.50, 1.25, 10.00]}
    httpx.post(f"{stack.hosted}/sim/config", json={"prices": prices}, timeout=5).raise_for_status()

    policy = load_policy_file(reconciling_policy(stack))
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)  # after the requests: a run across midnight still covers them
    with ProviderReportClient(UPSTREAM_KEY) as reports:
        provider_rows = import_openai_usage(reports.json, f"{stack.hosted}/v1", today, tomorrow)
    report = reconcile(engine, policy, "hosted", provider_rows, today, tomorrow).to_json()

    rows = by_model(report)
    assert rows["sim-large"]["status"] == MATCHED
    drift = rows["gpt-4o-mini"]
    assert [r["reason"] for r in drift["reasons"]] == [PRICE_DRIFT]
    assert drift["difference"]["requests"] == drift["difference"]["input_tokens"] == drift["difference"]["output_tokens"] == 0
    # 0.10 USD per 1M output tokens more = 100,000 pico-dollars per output token.
    assert drift["difference"]["cost_pico"] == mini.completion_tokens * 100_000


def test_pool_counters_agree_with_the_ledger_over_a_window(stack: Stack) -> None:
    policy = load_policy_file(stack.policy_path)
    replicas = policy.upstreams["pool"].urls()
    with ProviderReportClient() as metrics:
        before = scrape(metrics.text, replicas)
        client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0, timeout=20)
        client.chat.completions.create(model="pool-model", messages=HELLO)
        list(client.chat.completions.create(model="pool-model", messages=LONGER, stream=True))
        engine = ledger_engine(stack)
        events = wait_for_events(engine, "pool", 2)
        after = scrape(metrics.text, replicas)
    rows, notes = window_rows(before, after)
    report = reconcile(engine, policy, "pool", rows, before.at, after.at)

    [row] = report.rows
    assert row.matched, report.to_text()
    assert row.ledger.requests == row.provider.requests == 2
    assert row.provider.input_tokens == sum(e.prompt_tokens for e in events)
    assert row.provider.output_tokens == sum(e.completion_tokens for e in events)
    assert "cached_tokens" in row.not_reported and notes == []
