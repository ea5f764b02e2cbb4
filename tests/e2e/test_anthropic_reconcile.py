"""Reconciliation of a `kind: anthropic` upstream end to end: calls through the gateway
with the real anthropic SDK (some writing and some reading the prompt cache, one
streamed), booked in its SQLite ledger, billed by the Anthropic simulator, then
compared with the simulator's Admin API usage and cost reports over HTTP. They agree to
the token and the pico-dollar; a call the provider billed but the gateway never saw is
then the one difference, with its reason and its exact cost."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from sqlalchemy import text

from gateway.accounting.database import make_engine
from gateway.accounting.importers import reconcile_upstream, run_reconcile
from gateway.accounting.reconcile import MATCHED, MISSING_AT_GATEWAY
from gateway.routing.loader import load_policy_file
from gateway.sim.anthropic import AnthropicSimConfig, AnthropicSimulator, create_anthropic_app
from gateway.sim.anthropic_state import api_key_id
from tests.support.servers import run_asgi_in_thread
from tests.support.stack import Stack, running_stack

UPSTREAM_KEY = "sk-ant-api03-upstream-5d1e"
ADMIN_KEY = "sk-ant-admin01-reports-9c2b"
KEY_ID = api_key_id(UPSTREAM_KEY)  # how the simulator's reports name the gateway's key
MODEL = "claude-haiku-4-5"
# The simulator's price for claude-haiku-4-5 (USD per 1M tokens): the gateway books at the same.
PRICE = {"input": Decimal("1.00"), "cached_input": Decimal("0.10"), "cache_write": Decimal("1.25"), "cache_write_1h": Decimal("2.00"),
         "output": Decimal("5.00")}
TERMS = "Invoices are due thirty days after issue; overdue ones accrue interest monthly. " * 120
INJECTED = {"model": MODEL, "api_key_id": KEY_ID, "uncached_input_tokens": 1000, "cache_read_input_tokens": 3000,
            "cache_creation": {"ephemeral_5m_input_tokens": 400, "ephemeral_1h_input_tokens": 200}, "output_tokens": 250}
# 1000 x 1.00 + 3000 x 0.10 + 400 x 1.25 + 200 x 2.00 (the 1-hour rate) + 250 x 5.00
# = 3450 micro-dollars: the cache writes at their own rates, so no price drift is left.
INJECTED_PICO = 3_450_000_000


@dataclass
class ClaudeStack:
    stack: Stack
    sim: AnthropicSimulator
    sim_url: str

    @property
    def ledger_url(self) -> str:
        return f"sqlite:///{self.stack.var_dir / 'ledger.db'}"


def _add_claude(sim_url: str) -> Any:
    def edit(policy: str) -> str:
        policy = policy.replace("upstreams:\n", f"upstreams:\n  claude: {{kind: anthropic, base_url: \"{sim_url}\", "
                                "api_key_env: GATEWAY_TEST_ANTHROPIC_KEY, admin_key_env: GATEWAY_TEST_ANTHROPIC_ADMIN_KEY, "
                                f"provider_key_id: {KEY_ID}}}\n", 1)
        price = ", ".join(f"{k}: {v}" for k, v in PRICE.items())
        return policy.replace("models:\n", f"models:\n  claude-small:\n    upstream: claude\n    upstream_model: {MODEL}\n"
                              f"    price: {{{price}}}\n", 1)
    return edit


@pytest.fixture
def claude(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClaudeStack]:
    monkeypatch.setenv("GATEWAY_TEST_ANTHROPIC_KEY", UPSTREAM_KEY)
    monkeypatch.setenv("GATEWAY_TEST_ANTHROPIC_ADMIN_KEY", ADMIN_KEY)
    sim = create_anthropic_app(AnthropicSimConfig(api_keys=[UPSTREAM_KEY]))
    with run_asgi_in_thread(sim) as sim_url, running_stack(tmp_path, edit_policy=_add_claude(sim_url)) as stack:
        yield ClaudeStack(stack, sim, sim_url)


def make_calls(claude: ClaudeStack) -> None:
    client = anthropic.Anthropic(base_url=claude.stack.root, api_key=claude.stack.key, max_retries=0, timeout=20)
    cached: Any = [{"type": "text", "text": TERMS, "cache_control": {"type": "ephemeral"}}]
    for question in ("When are invoices due?", "What accrues on overdue ones?"):  # writes the cache, then reads it
        client.messages.create(model="claude-small", max_tokens=48, system=cached, messages=[{"role": "user", "content": question}])
    with client.messages.stream(model="claude-small", max_tokens=48, system=cached,
                                messages=[{"role": "user", "content": "Summarise the terms."}]) as stream:
        stream.get_final_message()
    client.messages.create(model="claude-small", max_tokens=32, messages=[{"role": "user", "content": "Say hello."}])
    billed = claude.sim.state.usage.records
    assert len(billed) == 4 and billed[0].cache_write_5m > 1024 and billed[1].cache_read == billed[2].cache_read > 1024


def wait_for_bookings(claude: ClaudeStack, count: int, deadline_s: float = 10.0) -> list[Any]:
    """The gateway books just after it answers: poll the ledger, with a deadline."""
    engine = make_engine(claude.ledger_url)
    query = text("SELECT * FROM usage_events WHERE upstream = 'claude' AND kind = 'model' AND usage_known ORDER BY id")
    deadline = time.monotonic() + deadline_s
    try:
        while True:
            with engine.connect() as conn:
                rows = list(conn.execute(query))
            if len(rows) >= count or time.monotonic() > deadline:
                assert len(rows) == count, f"expected {count} booked calls, found {len(rows)}"
                return rows
            time.sleep(0.05)
    finally:
        engine.dispose()


def admin_report(claude: ClaudeStack) -> dict[str, Any]:
    engine = make_engine(claude.ledger_url)
    try:
        policy = load_policy_file(claude.stack.policy_path)
        return asyncio.run(reconcile_upstream(engine, policy, "claude", datetime.now(UTC).date()))
    finally:
        engine.dispose()


def test_the_admin_api_reports_match_the_ledger_then_show_a_call_the_gateway_never_saw(claude: ClaudeStack) -> None:
    make_calls(claude)
    booked = wait_for_bookings(claude, 4)
    today = datetime.now(UTC).date()

    # The CLI: exit 0, everything matched, and the admin key nowhere in what it prints.
    code, report_text = run_reconcile(str(claude.stack.policy_path), claude.ledger_url, "claude", today, None, False)
    assert code == 0, report_text
    assert "Anthropic Admin API" in report_text and ADMIN_KEY not in report_text

    [row] = admin_report(claude)["rows"]
    assert (row["model"], row["key_id"], row["status"], row["reasons"]) == (MODEL, KEY_ID, MATCHED, [])
    billed = claude.sim.state.usage.records
    tokens = {"input_tokens": sum(r.uncached_input + r.cache_read + r.cache_write_5m + r.cache_write_1h for r in billed),
              "cached_tokens": sum(r.cache_read for r in billed), "output_tokens": sum(r.output for r in billed)}
    for side in ("ledger", "provider"):
        assert {k: row[side][k] for k in tokens} == tokens
    # To the pico-dollar: the cost report's cents against what the ledger booked.
    assert row["provider"]["cost_pico"] == row["ledger"]["cost_pico"] == sum(e.cost_pico for e in booked)
    assert row["provider_cost_estimated"] is False and row["not_reported"] == ["requests"]

    # The provider bills a call the gateway never saw.
    httpx.post(f"{claude.sim_url}/sim/usage/inject", json=INJECTED, timeout=5).raise_for_status()
    code, report_text = run_reconcile(str(claude.stack.policy_path), claude.ledger_url, "claude", today, None, False)
    assert code == 1 and MISSING_AT_GATEWAY in report_text, report_text

    report = admin_report(claude)
    [row] = report["rows"]
    [reason] = row["reasons"]
    expected = {"input_tokens": 4600, "cached_tokens": 3000, "cache_write_tokens": 600, "cache_write_1h_tokens": 200,
                "output_tokens": 250, "cost_pico": INJECTED_PICO}
    assert reason["reason"] == MISSING_AT_GATEWAY
    assert {k: reason[k] for k in expected} == {k: row["difference"][k] for k in expected} == expected
    assert report["totals"]["difference"]["cost_pico"] == INJECTED_PICO


def test_without_an_admin_key_the_report_says_one_is_needed(claude: ClaudeStack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_TEST_ANTHROPIC_ADMIN_KEY")
    code, report_text = run_reconcile(str(claude.stack.policy_path), claude.ledger_url, "claude",
                                      datetime.now(UTC).date(), None, False)
    assert code == 2 and "GATEWAY_TEST_ANTHROPIC_ADMIN_KEY" in report_text
    # The inference key is not an admin key: the simulator, like Anthropic, refuses it.
    monkeypatch.setenv("GATEWAY_TEST_ANTHROPIC_ADMIN_KEY", os.environ["GATEWAY_TEST_ANTHROPIC_KEY"])
    code, report_text = run_reconcile(str(claude.stack.policy_path), claude.ledger_url, "claude",
                                      datetime.now(UTC).date(), None, False)
    assert code == 2 and "401" in report_text and UPSTREAM_KEY not in report_text
