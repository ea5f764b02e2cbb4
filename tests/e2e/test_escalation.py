"""Routes escalate on verifiable signals only, bill every attempt to the request and
task, stop at the budget with the best answer so far, and report why."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.cli import main as cli_main
from tests.support.stack import ADMIN_KEY, Stack, running_stack

ROUTE = """\
  careful:
    chain: [gpt-4o-mini, sim-large]
    escalate_when: [truncated, empty, {client_signal: {header: x-retrieval-coverage, below: 0.5}}]
  careful-stream:
    chain: [gpt-4o-mini, sim-large]
    escalate_when: [{client_signal: {header: x-retrieval-coverage, below: 0.5}}]
    streaming: no_escalation
"""
Q: Any = [{"role": "user", "content": "Summarise the retrieved passages."}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    def edit(text: str) -> str:
        return text.replace("routes:\n", "routes:\n" + ROUTE, 1)
    with running_stack(tmp_path_factory.mktemp("escalation"), edit_policy=edit) as running:
        yield running


def chat(stack: Stack, coverage: str | None = None, **extra: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {stack.key}", **extra.pop("headers", {})}
    if coverage is not None:
        headers["x-retrieval-coverage"] = coverage
    return httpx.post(f"{stack.gateway}/chat/completions", json={"model": "careful", "messages": Q, **extra}, headers=headers, timeout=30)


def test_answer_that_passes_is_not_escalated(stack: Stack) -> None:
    r = chat(stack, "0.9")
    assert r.status_code == 200
    assert (r.headers["x-gateway-model"], r.headers["x-gateway-escalations"]) == ("gpt-4o-mini", "0")


def test_failed_check_escalates_to_the_next_model_and_bills_both(stack: Stack) -> None:
    task = httpx.post(f"{stack.gateway}/tasks", headers={"authorization": f"Bearer {stack.key}"}, json={}).json()["id"]
    r = chat(stack, "0.2", headers={"x-task-id": task})
    assert (r.headers["x-gateway-model"], r.headers["x-gateway-escalations"]) == ("sim-large", "1")
    books = httpx.get(f"{stack.gateway}/tasks/{task}", headers={"authorization": f"Bearer {stack.key}"}).json()
    models = [e["model"] for e in books["events"]]
    assert models == ["gpt-4o-mini", "sim-large"], "both attempts are billed to the task"
    assert Decimal(r.headers["x-gateway-cost-usd"]) == sum(Decimal(e["cost_usd"]) for e in books["events"])


def test_truncated_answer_escalates(stack: Stack) -> None:
    r = chat(stack, max_tokens=3)
    assert r.headers["x-gateway-escalations"] == "1"
    assert r.json()["choices"][0]["finish_reason"] == "length"  # the strong model was cut short too: best so far


def test_high_risk_goes_straight_to_the_strong_model(stack: Stack) -> None:
    r = chat(stack, "0.2", headers={"x-task-risk": "high"})
    assert (r.headers["x-gateway-model"], r.headers["x-gateway-escalations"]) == ("sim-large", "0")


def test_budget_that_cannot_afford_the_next_model_stops_with_the_best_answer(stack: Stack) -> None:
    # Enough for one cheap answer, far too little for the strong model's worst case.
    task = httpx.post(f"{stack.gateway}/tasks", headers={"authorization": f"Bearer {stack.key}"},
                      json={"budget_usd": "0.0003"}).json()["id"]
    r = chat(stack, "0.2", headers={"x-task-id": task}, max_tokens=100)
    assert r.status_code == 200
    assert r.headers["x-gateway-model"] == "gpt-4o-mini"
    assert r.headers["x-gateway-escalation-stopped"] == "budget"
    assert r.json()["choices"][0]["message"]["content"]


def test_streamed_request_is_buffered_checked_and_replayed(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="careful", messages=Q, stream=True,
                                                           extra_headers={"x-retrieval-coverage": "0.1"})
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert raw.headers["x-gateway-model"] == "sim-large" and raw.headers["x-gateway-escalations"] == "1"
    direct = client.chat.completions.create(model="sim-large", messages=Q)
    assert text == direct.choices[0].message.content


def test_no_escalation_streaming_mode_streams_the_first_answer(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="careful-stream", messages=Q, stream=True,
                                                           extra_headers={"x-retrieval-coverage": "0.1"})
    list(raw.parse())
    assert raw.headers["x-gateway-model"] == "gpt-4o-mini"


def test_routes_report_shows_escalation_by_reason(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    chat(stack, "0.2")
    report = httpx.get(f"{stack.gateway.removesuffix('/v1')}/admin/routes", headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
    careful = report["routes"]["careful"]
    assert careful["requests"] >= 3 and 0 < careful["escalation_rate"] <= 1
    assert careful["escalation_rate_by_reason"]["client_signal"] > 0
    assert careful["strongest_model"] == "sim-large"
    metrics = stack.metrics()
    assert 'gateway_escalations_total{reason="client_signal",route="careful"}' in metrics
    code = cli_main(["routes", "report", "--policy", str(stack.policy_path),
                     "--database-url", f"sqlite:///{stack.var_dir / 'ledger.db'}"])
    assert code == 0 and "careful" in capsys.readouterr().out


def test_unknown_signal_is_a_policy_error(tmp_path: Path) -> None:
    from gateway.routing.loader import PolicyInvalid, parse_policy

    bad = "version: 1\nupstreams: {u: {kind: openai, base_url: 'http://x/v1'}}\nmodels: {m: {upstream: u}}\n" \
          "routes: {r: {chain: [m], escalate_when: [vibes]}}\n"
    with pytest.raises(PolicyInvalid) as info:
        parse_policy(bad, "p.yaml")
    assert any("routes.r.escalate_when[0]" in str(p) for p in info.value.problems)
