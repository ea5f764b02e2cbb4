"""Reconciliation with hand-built ledger rows (a temporary SQLite ledger) and hand-built
provider rows: one case per reason, the amounts each reason explains, and the
importers that turn provider reports into rows."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from sqlalchemy import Engine

from gateway.accounting.database import make_engine, migrate
from gateway.accounting.importers import TextProgress, parse_provider, run_reconcile
from gateway.accounting.importers.anthropic_usage import import_anthropic_usage, parse_usage_page, read_report_file
from gateway.accounting.importers.csv_export import parse_csv
from gateway.accounting.importers.openai_usage import QueryValue, import_openai_usage
from gateway.accounting.importers.vllm_metrics import Scrape, parse_metrics, window_rows
from gateway.accounting.reconcile import (
    CANCELLED,
    MATCHED,
    MISSING_AT_GATEWAY,
    MISSING_AT_PROVIDER,
    PENDING,
    PRICE_DRIFT,
    RETRIED,
    UNCONFIRMED,
    Amounts,
    ImportFailed,
    ProviderUsage,
    ReconciliationReport,
    ReconciliationRow,
    reconcile,
)
from gateway.accounting.tables import reservations, usage_events
from gateway.routing.loader import parse_policy
from gateway.sim.vllm_metrics import VllmMetrics
from gateway.upstreams.provider_reports import ProviderReportClient, ProviderReportError
from tests.support.servers import run_asgi_in_thread

POLICY_TEXT = """\
version: 1
upstreams:
  hosted: {kind: openai, base_url: "http://provider.test/v1", api_key_env: RECONCILE_TEST_KEY, provider_key_id: key_gw}
  pool: {kind: vllm, replicas: ["http://pool.test/v1"]}
models:
  gpt-4o-mini: {upstream: hosted, price: {input: 0.15, cached_input: 0.075, output: 0.60}}
  pool-model: {upstream: pool, price: {input: 0.05, output: 0.20}}
"""
POLICY = parse_policy(POLICY_TEXT)
DAY, NEXT = date(2026, 5, 1), date(2026, 5, 2)
AT = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
WORST_CASE = 500_000_000  # what an expired reservation charged


def mini_cost(prompt: int, cached: int, output: int) -> int:
    """gpt-4o-mini at the policy's price, in pico-dollars (1 USD per 1M tokens = 1e6 pico per token)."""
    return (prompt - cached) * 150_000 + cached * 75_000 + output * 600_000


class Ledger:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def attempt(self, request_id: str, usage: tuple[int, int, int] | None = (100, 0, 50), *, attempt: int = 1,
                status: str = "ok", reservation: str | None = None, upstream: str = "hosted",
                model: str = "gpt-4o-mini", at: datetime = AT, cost: int | None = None) -> None:
        prompt, cached, output = usage or (0, 0, 0)
        row = dict(request_id=request_id, attempt=attempt, reservation_id=reservation, tenant="acme", key_id="k1",
                   kind="model", endpoint="chat.completions", model=model, upstream_model=model, upstream=upstream,
                   status=status, usage_known=usage is not None, prompt_tokens=prompt, cached_tokens=cached,
                   completion_tokens=output, cost_pico=mini_cost(prompt, cached, output) if cost is None else cost,
                   created_at=at, day=at.date().isoformat())
        with self.engine.begin() as conn:
            conn.execute(usage_events.insert(), [row])

    def hold(self, hold_id: str, request_id: str, state: str) -> None:
        row = dict(id=hold_id, request_id=request_id, tenant="acme", key_id="k1", model="gpt-4o-mini", upstream="hosted",
                   endpoint="chat.completions", budget_ids="tenant:acme", amount_pico=WORST_CASE, tokens=1000,
                   state=state, created_at=AT, expires_at=AT + timedelta(minutes=15))
        with self.engine.begin() as conn:
            conn.execute(reservations.insert(), [row])

    def expired(self, hold_id: str, request_id: str) -> None:
        """What the sweeper leaves when a hold expires unconfirmed: the worst case charged."""
        self.hold(hold_id, request_id, "expired")
        self.attempt(request_id, None, attempt=0, status="unconfirmed", reservation=hold_id, cost=WORST_CASE)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    migrate(engine)
    return Ledger(engine)


def billed(requests: int | None, prompt: int, cached: int | None, output: int, cost: int | None = -1, *,
           model: str = "gpt-4o-mini", key: str | None = "key_gw", day: date = DAY) -> ProviderUsage:
    """A provider row; its cost defaults to the tokens at the policy's own price."""
    if cost == -1:
        cost = mini_cost(prompt, cached or 0, output)
    return ProviderUsage(day, model, key, prompt, cached, output, requests, cost, "test report")


def compare(ledger: Ledger, *rows: ProviderUsage) -> ReconciliationReport:
    report = reconcile(ledger.engine, POLICY, "hosted", rows, DAY, NEXT)
    for row in report.rows:  # every difference is explained, exactly, by its reasons
        if row.matched:
            assert row.difference.counts_match() and abs(row.difference.cost_pico) <= report.cost_tolerance_pico
        else:
            assert sum((e.amounts for e in row.explanations), Amounts()) == row.difference, row
    json.dumps(report.to_json())
    return report


def only(report: ReconciliationReport) -> ReconciliationRow:
    [row] = report.rows
    return row


def explained(row: ReconciliationRow) -> dict[str, Amounts]:
    return {e.reason: e.amounts for e in row.explanations}


def test_identical_usage_is_matched(ledger: Ledger) -> None:
    ledger.attempt("r1", (100, 20, 50))
    ledger.attempt("r2", (300, 0, 10))
    row = only(compare(ledger, billed(2, 400, 20, 60)))
    assert row.matched and row.reasons == [MATCHED]
    assert row.ledger == row.provider == Amounts(2, 400, 20, 60, mini_cost(400, 20, 60))


@pytest.mark.parametrize(("extra_pico", "reasons"), [(900, [MATCHED]), (20_000_000, [PRICE_DRIFT])])
def test_cost_difference_with_matching_tokens_is_price_drift_beyond_the_tolerance(ledger: Ledger, extra_pico: int,
                                                                                  reasons: list[str]) -> None:
    ledger.attempt("r1")
    row = only(compare(ledger, billed(1, 100, 0, 50, mini_cost(100, 0, 50) + extra_pico)))
    assert row.reasons == reasons
    if not row.matched:
        assert explained(row) == {PRICE_DRIFT: Amounts(cost_pico=extra_pico)}


def test_usage_the_gateway_never_saw_is_missing_at_gateway(ledger: Ledger) -> None:
    ledger.attempt("r1")
    row = only(compare(ledger, billed(2, 1100, 0, 80)))
    assert explained(row) == {MISSING_AT_GATEWAY: Amounts(1, 1000, 0, 30, mini_cost(1000, 0, 30))}


def test_a_group_only_the_provider_has_is_missing_at_gateway(ledger: Ledger) -> None:
    ledger.attempt("r1")
    report = compare(ledger, billed(1, 100, 0, 50), billed(3, 900, 0, 90, 123_456_789, model="gpt-4.1"))
    new = next(r for r in report.rows if r.model == "gpt-4.1")
    assert not new.in_ledger and new.at_provider
    assert explained(new) == {MISSING_AT_GATEWAY: Amounts(3, 900, 0, 90, 123_456_789)}


def test_usage_the_provider_does_not_report_is_missing_at_provider(ledger: Ledger) -> None:
    ledger.attempt("r1", (100, 0, 50))
    ledger.attempt("r2", (200, 40, 70))
    row = only(compare(ledger, billed(1, 100, 0, 50)))
    assert explained(row) == {MISSING_AT_PROVIDER: Amounts(-1, -200, -40, -70, -mini_cost(200, 40, 70))}


def test_a_group_the_provider_does_not_report_is_missing_at_provider(ledger: Ledger) -> None:
    ledger.attempt("r1", (100, 0, 50))
    row = only(compare(ledger))
    assert not row.at_provider
    assert explained(row) == {MISSING_AT_PROVIDER: Amounts(-1, -100, 0, -50, -mini_cost(100, 0, 50))}


def test_unknown_usage_on_a_held_reservation_is_pending(ledger: Ledger) -> None:
    ledger.attempt("r1")
    ledger.hold("rsv_a", "r2", "reserved")
    ledger.attempt("r2", None, status="cancelled", reservation="rsv_a")
    row = only(compare(ledger, billed(2, 160, 0, 70)))
    assert row.attempts == {"booked": 1, PENDING: 1}
    assert explained(row) == {PENDING: Amounts(1, 60, 0, 20, mini_cost(60, 0, 20))}


@pytest.mark.parametrize("status", ["cancelled", "timeout", "cut"])
def test_an_attempt_cut_short_explains_what_the_provider_billed_for_it(ledger: Ledger, status: str) -> None:
    ledger.attempt("r1")
    ledger.attempt("r2", None, status=status)
    row = only(compare(ledger, billed(2, 180, 0, 60)))
    assert explained(row) == {CANCELLED: Amounts(1, 80, 0, 10, mini_cost(80, 0, 10))}


def test_a_failed_attempt_that_was_retried_explains_an_extra_billed_request(ledger: Ledger) -> None:
    ledger.attempt("r1", None, attempt=1, status="error")
    ledger.attempt("r1", (100, 0, 50), attempt=2)
    row = only(compare(ledger, billed(2, 200, 0, 50)))
    assert row.attempts == {"booked": 1, RETRIED: 1}
    assert explained(row) == {RETRIED: Amounts(1, 100, 0, 0, mini_cost(100, 0, 0))}


def test_a_single_failed_attempt_explains_nothing(ledger: Ledger) -> None:
    ledger.attempt("r1")
    ledger.attempt("r2", None, status="error")
    row = only(compare(ledger, billed(2, 200, 0, 50)))
    assert row.attempts == {"booked": 1, "failed": 1}
    assert list(explained(row)) == [MISSING_AT_GATEWAY]


def test_an_expired_reservation_the_provider_billed_is_unconfirmed(ledger: Ledger) -> None:
    ledger.attempt("r1")
    ledger.expired("rsv_x", "r2")
    row = only(compare(ledger, billed(2, 150, 0, 60)))
    assert row.ledger.cost_pico == mini_cost(100, 0, 50) + WORST_CASE
    # The ledger charged the worst case; the provider billed 50 input and 10 output tokens for it.
    assert explained(row) == {UNCONFIRMED: Amounts(1, 50, 0, 10, mini_cost(50, 0, 10) - WORST_CASE)}


def test_an_expired_reservation_the_provider_did_not_bill_is_unconfirmed_cost_only(ledger: Ledger) -> None:
    ledger.attempt("r1")
    ledger.expired("rsv_x", "r2")
    row = only(compare(ledger, billed(1, 100, 0, 50)))
    assert explained(row) == {UNCONFIRMED: Amounts(cost_pico=-WORST_CASE)}


def test_a_booked_cancelled_attempt_and_its_later_unconfirmed_row_count_as_one_request(ledger: Ledger) -> None:
    ledger.attempt("r1")
    ledger.hold("rsv_c", "r2", "expired")
    ledger.attempt("r2", None, status="cancelled", reservation="rsv_c")
    ledger.attempt("r2", None, attempt=0, status="unconfirmed", reservation="rsv_c", cost=WORST_CASE)
    row = only(compare(ledger, billed(3, 300, 0, 90)))  # the cancelled stream and one the gateway never saw
    reasons = explained(row)
    assert reasons[CANCELLED].requests == 1 and reasons[MISSING_AT_GATEWAY].requests == 1
    assert reasons[UNCONFIRMED] == Amounts(cost_pico=-WORST_CASE)


def test_several_reasons_share_a_difference_in_order(ledger: Ledger) -> None:
    ledger.attempt("r1")
    ledger.hold("rsv_p", "r2", "reserved")
    ledger.attempt("r2", None, status="timeout", reservation="rsv_p")
    ledger.attempt("r3", None, status="cut")
    row = only(compare(ledger, billed(4, 400, 0, 110)))
    reasons = explained(row)
    assert [e.reason for e in row.explanations] == [PENDING, CANCELLED, MISSING_AT_GATEWAY]
    assert {r: a.requests for r, a in reasons.items()} == {PENDING: 1, CANCELLED: 1, MISSING_AT_GATEWAY: 1}
    assert sum(a.input_tokens for a in reasons.values()) == 300 and sum(a.output_tokens for a in reasons.values()) == 60


def test_other_upstreams_other_days_and_cache_hits_are_not_counted(ledger: Ledger) -> None:
    ledger.attempt("r1")
    ledger.attempt("r2", upstream="pool", model="pool-model")
    ledger.attempt("r3", at=AT - timedelta(days=1))
    row = only(compare(ledger, billed(1, 100, 0, 50), billed(5, 500, 0, 50, day=NEXT)))
    assert row.matched and row.day == DAY


def test_usage_billed_to_other_keys_is_left_out_and_said_so(ledger: Ledger) -> None:
    ledger.attempt("r1")
    report = compare(ledger, billed(1, 100, 0, 50), billed(9, 999, 0, 99, key="key_someone_else"))
    assert only(report).matched
    assert any("key_someone_else" in note for note in report.notes)


def test_without_a_provider_key_id_every_key_is_compared(ledger: Ledger) -> None:
    ledger.attempt("r1")
    ledger.attempt("r2")
    policy = parse_policy(POLICY_TEXT.replace(", provider_key_id: key_gw", ""))
    report = reconcile(ledger.engine, policy, "hosted", [billed(1, 100, 0, 50, key="key_a"), billed(1, 100, 0, 50, key="key_b")], DAY, NEXT)
    row = only(report)
    assert row.matched and row.key_id is None
    assert any("provider_key_id" in note for note in report.notes)


def test_a_dated_snapshot_compares_as_the_alias_the_gateway_sent(ledger: Ledger) -> None:
    ledger.attempt("r1")
    row = only(compare(ledger, billed(1, 100, 0, 50, model="gpt-4o-mini-2024-07-18")))
    assert row.matched and row.model == "gpt-4o-mini"


def test_fields_a_source_does_not_report_are_not_compared(ledger: Ledger) -> None:
    ledger.attempt("r1", (100, 30, 50))
    row = only(compare(ledger, billed(None, 100, None, 50, None)))
    assert row.matched and set(row.not_reported) == {"requests", "cached_tokens", "cost"} and row.provider_cost_estimated
    # Without a cost from the source, a token difference is priced at the gateway's price.
    more = only(compare(ledger, billed(None, 100, None, 60, None)))
    assert explained(more) == {MISSING_AT_GATEWAY: Amounts(output_tokens=10, cost_pico=mini_cost(0, 0, 10))}


def test_a_window_compares_as_one_period(ledger: Ledger) -> None:
    ledger.attempt("r1", at=AT)
    ledger.attempt("r2", at=AT + timedelta(hours=3))  # after the window
    rows = [billed(1, 100, 0, 50, day=DAY)]
    report = reconcile(ledger.engine, POLICY, "hosted", rows, AT - timedelta(minutes=5), AT + timedelta(minutes=5))
    assert only(report).matched and not report.window.whole_days


def test_the_report_reads_as_a_table_and_as_json(ledger: Ledger) -> None:
    ledger.attempt("r1")
    ledger.attempt("r2", None, status="cancelled")
    report = compare(ledger, billed(2, 150, 0, 60), billed(1, 10, 0, 1, model="gpt-4.1"))
    text = report.to_text()
    assert "gpt-4o-mini" in text and "cancelled: +1 requests, +50 input, +10 output tokens" in text
    assert "missing at gateway" in text and "2 of 2 groups differ." in text
    data = report.to_json()
    assert data["matched"] is False and data["totals"]["difference"]["requests"] == 2
    assert data["totals"][CANCELLED]["requests"] == 1 and data["totals"][MISSING_AT_GATEWAY]["requests"] == 1
    mini = next(row for row in data["rows"] if row["model"] == "gpt-4o-mini")
    assert mini["reasons"] == [{"reason": CANCELLED, "requests": 1, "input_tokens": 50, "cached_tokens": 0, "output_tokens": 10,
                                "cost_pico": 13_500_000, "cache_write_tokens": 0, "cache_write_1h_tokens": 0,
                                "cost_usd": "0.0000135"}]


# --- importers ------------------------------------------------------------------


class FakeReports:
    """Serves recorded pages by (endpoint, page cursor) and remembers every call."""

    def __init__(self, pages: Mapping[tuple[str, str | None], dict[str, Any]]) -> None:
        self.pages = pages
        self.calls: list[tuple[str, dict[str, QueryValue]]] = []

    def __call__(self, url: str, params: Mapping[str, QueryValue]) -> dict[str, Any]:
        self.calls.append((url, dict(params)))
        cursor = params.get("page")
        return self.pages[(url.rsplit("/", 1)[-1], cursor if isinstance(cursor, str) else None)]


def bucket(day: date, *results: dict[str, Any]) -> dict[str, Any]:
    start = int(datetime.combine(day, datetime.min.time(), tzinfo=UTC).timestamp())
    return {"object": "bucket", "start_time": start, "end_time": start + 86400, "results": list(results)}


def usage(model: str, key: str, inp: int, cached: int, out: int, n: int) -> dict[str, Any]:
    return {"object": "organization.usage.completions.result", "model": model, "api_key_id": key, "input_tokens": inp,
            "input_cached_tokens": cached, "output_tokens": out, "num_model_requests": n}


def page(*buckets: dict[str, Any], next_page: str | None = None) -> dict[str, Any]:
    return {"object": "page", "data": list(buckets), "has_more": next_page is not None, "next_page": next_page}


def test_openai_importer_follows_pages_and_merges_costs() -> None:
    cost = {"object": "organization.costs.result", "amount": {"value": 0.0000345, "currency": "usd"},
            "line_item": "gpt-4o-mini-2024-07-18, input", "api_key_id": "key_gw"}
    fake = FakeReports({
        ("completions", None): page(bucket(DAY, usage("gpt-4o-mini-2024-07-18", "key_gw", 100, 20, 30, 2)), next_page="page_2"),
        ("completions", "page_2"): page(bucket(NEXT, usage("gpt-4o-mini-2024-07-18", "key_gw", 5, 0, 5, 1))),
        ("embeddings", None): page(bucket(DAY, {"model": "text-embedding-3-small", "api_key_id": "key_gw",
                                                "input_tokens": 7, "num_model_requests": 1})),
        ("costs", None): page(bucket(DAY, cost, {**cost, "line_item": "gpt-4o-mini-2024-07-18, output"})),
    })
    progress: list[tuple[int, str]] = []
    rows = import_openai_usage(fake, "http://provider.test/v1/", DAY, NEXT + timedelta(days=1),
                               on_progress=lambda done, note: progress.append((done, note)))
    assert [(r.day, r.model, r.input_tokens, r.cached_tokens, r.output_tokens, r.requests, r.cost_pico) for r in rows] == [
        (DAY, "gpt-4o-mini-2024-07-18", 100, 20, 30, 2, 69_000_000),
        (DAY, "text-embedding-3-small", 7, 0, 0, 1, 0),
        (NEXT, "gpt-4o-mini-2024-07-18", 5, 0, 5, 1, 0),
    ]
    assert [done for done, _ in progress] == [1, 2, 3, 4]
    url, params = fake.calls[0]
    assert url == "http://provider.test/v1/organization/usage/completions"
    assert params["bucket_width"] == "1d" and params["group_by"] == "model,api_key_id" and params["start_time"] == 1777593600


@pytest.mark.parametrize(("pages", "message"), [
    ({("completions", None): page(next_page="p"), ("completions", "p"): page(next_page="p")}, "repeats"),
    ({("completions", None): {"object": "page"}}, "no `data`"),
    ({("completions", None): page(bucket(DAY, usage("m", "k", -1, 0, 0, 1)))}, "non-negative"),
])
def test_openai_importer_refuses_reports_that_make_no_sense(pages: dict[tuple[str, str | None], dict[str, Any]], message: str) -> None:
    with pytest.raises(ImportFailed, match=message):
        import_openai_usage(FakeReports(pages), "http://provider.test/v1", DAY, NEXT)


def test_csv_export_accepts_aliases_sums_groups_and_keeps_the_window() -> None:
    text = ("Date,Model,API_Key_ID,Prompt_Tokens,Cached_Tokens,Completion_Tokens,Requests,Cost_USD\n"
            "2026-05-01,gpt-4o-mini,key_gw,100,20,30,2,$0.0000345\n"
            "2026-05-01T23:30:00+00:00,gpt-4o-mini,key_gw,\"1,000\",0,5,1,0.001\n"
            "2026-05-02,gpt-4o-mini,key_gw,5,0,5,1,0\n\n")
    [row] = parse_csv(text, DAY, NEXT)
    assert (row.input_tokens, row.cached_tokens, row.output_tokens, row.requests, row.cost_pico) == (1100, 20, 35, 3, 1_034_500_000)
    [bare] = parse_csv("day,model,input_tokens\n2026-05-01,m,10\n", DAY, NEXT)
    assert (bare.cached_tokens, bare.requests, bare.cost_pico, bare.key_id) == (None, None, None, None)


@pytest.mark.parametrize(("text", "message"), [
    ("model,input_tokens\nm,1\n", "no column for day"),
    ("day,model,input_tokens\n2026-05-01,m,1.5\n", ":2: input"),
    ("day,model,input_tokens\nyesterday,m,1\n", ":2: day"),
])
def test_csv_export_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ImportFailed, match=message):
        parse_csv(text, DAY, NEXT)


# Recorded shape of Anthropic's GET /v1/organizations/usage_report/messages (Admin API).
ANTHROPIC_PAGE: dict[str, Any] = {
    "data": [{
        "starting_at": "2026-05-01T00:00:00Z", "ending_at": "2026-05-02T00:00:00Z",
        "results": [
            {"api_key_id": "apikey_01Rj2N8SVvo6BePZj99NhmiT", "workspace_id": "wrkspc_01JwQvzr7rXLA5AGx3HKfFUJ",
             "model": "claude-sonnet-4-20250514", "service_tier": "standard", "context_window": "0-200k",
             "uncached_input_tokens": 1500, "cache_read_input_tokens": 200,
             "cache_creation": {"ephemeral_1h_input_tokens": 1000, "ephemeral_5m_input_tokens": 500},
             "output_tokens": 500, "server_tool_use": {"web_search_requests": 10}},
            {"api_key_id": "apikey_01Rj2N8SVvo6BePZj99NhmiT", "workspace_id": None, "model": "claude-sonnet-4-20250514",
             "service_tier": "batch", "context_window": "0-200k", "uncached_input_tokens": 10, "cache_read_input_tokens": 0,
             "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0}, "output_tokens": 4,
             "server_tool_use": {"web_search_requests": 0}},
        ],
    }],
    "has_more": True,
    "next_page": "page_2026-05-02",
}


def test_anthropic_usage_report_counts_cache_reads_and_writes_as_input(tmp_path: Path) -> None:
    rows = parse_usage_page(ANTHROPIC_PAGE)
    assert [(r.input_tokens, r.cached_tokens, r.output_tokens) for r in rows] == [(3200, 200, 500), (10, 0, 4)]
    assert all(r.requests is None and r.cost_pico is None and r.day == DAY for r in rows)
    last = {"data": [], "has_more": False, "next_page": None}
    fake = FakeReports({("messages", None): ANTHROPIC_PAGE, ("messages", "page_2026-05-02"): last})
    [merged] = import_anthropic_usage(fake, "https://anthropic.test/v1", DAY, NEXT)
    assert (merged.model, merged.key_id, merged.input_tokens, merged.output_tokens) == (
        "claude-sonnet-4-20250514", "apikey_01Rj2N8SVvo6BePZj99NhmiT", 3210, 504)
    assert fake.calls[0][1]["starting_at"] == "2026-05-01T00:00:00Z"
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps([ANTHROPIC_PAGE, last]))
    [from_file] = read_report_file(saved, DAY, NEXT)
    assert from_file.group == merged.group and from_file.input_tokens == merged.input_tokens


def vllm_scrape(at: datetime, prompt: int, generated: int, finished: int, running: int = 0) -> Scrape:
    metrics = VllmMetrics("pool-model")  # the simulator's registry: vLLM's real names and format
    metrics.prompt_tokens.inc(prompt)
    metrics.generation_tokens.inc(generated)
    for _ in range(finished):
        metrics.finished("stop")
    return Scrape(at, {"http://pool.test/v1": parse_metrics(metrics.render(running, 0, 0.0).decode())})


def test_vllm_window_is_the_difference_of_two_scrapes() -> None:
    rows, notes = window_rows(vllm_scrape(AT, 1000, 200, 10), vllm_scrape(AT + timedelta(seconds=60), 1300, 260, 13))
    [row] = rows
    assert (row.model, row.input_tokens, row.output_tokens, row.requests, row.cached_tokens) == ("pool-model", 300, 60, 3, None)
    assert notes == []
    _, restarted = window_rows(vllm_scrape(AT, 1000, 200, 10), vllm_scrape(AT + timedelta(seconds=60), 50, 5, 1, running=2))
    assert any("restart" in n for n in restarted) and any("2 requests were running" in n for n in restarted)


def test_run_reconcile_reports_exit_codes_and_text(tmp_path: Path, ledger: Ledger) -> None:
    ledger.attempt("r1")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY_TEXT)
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    csv_path = tmp_path / "usage.csv"
    csv_path.write_text("day,model,api_key_id,input_tokens,output_tokens,requests\n2026-05-01,gpt-4o-mini,key_gw,100,50,1\n")
    assert run_reconcile(str(policy), db, f"csv:{csv_path}", DAY, NEXT, False)[0] == 0
    csv_path.write_text("day,model,api_key_id,input_tokens,output_tokens,requests\n2026-05-01,gpt-4o-mini,key_gw,200,50,2\n")
    err = io.StringIO()
    code, text = run_reconcile(str(policy), db, f"csv:hosted:{csv_path}", DAY, NEXT, True, stderr=err)
    assert code == 1 and "missing at gateway: +1 requests, +100 input" in text
    assert "100%" in err.getvalue()
    assert run_reconcile(str(policy), db, "nowhere", DAY, NEXT, False)[0] == 2
    assert run_reconcile(str(policy), f"sqlite:///{tmp_path / 'absent.db'}", "hosted", DAY, NEXT, False)[0] == 2
    assert not (tmp_path / "absent.db").exists()


def test_provider_specs_name_an_upstream_or_a_file() -> None:
    assert parse_provider("hosted", POLICY).kind == "openai"
    assert parse_provider("pool", POLICY).kind == "vllm"
    assert parse_provider("vllm:pool@5", POLICY).window_s == 5.0
    spec = parse_provider("csv:/tmp/a:b.csv", POLICY)
    assert (spec.kind, spec.upstream, str(spec.path)) == ("csv", "hosted", "/tmp/a:b.csv")
    for bad in ("vllm:pool@soon", "vllm:nowhere", "mystery"):
        with pytest.raises(ValueError):
            parse_provider(bad, POLICY)


def test_report_client_sends_the_key_but_never_shows_it() -> None:
    seen: list[dict[str, Any]] = []

    async def provider(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append({"headers": dict(scope["headers"]), "query": scope["query_string"]})
        body = b'{"error": {"message": "admin key required"}}'
        await send({"type": "http.response.start", "status": 403, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    with run_asgi_in_thread(provider) as url, ProviderReportClient("sk-secret-123") as client, \
            pytest.raises(ProviderReportError) as failure:
        client.json(f"{url}/v1/organization/costs", {"group_by[]": ["a", "b"], "limit": 3})
    assert seen[0]["headers"][b"authorization"] == b"Bearer sk-secret-123"
    assert parse_qs(seen[0]["query"].decode())["group_by[]"] == ["a", "b"]
    assert "403" in str(failure.value) and "sk-secret" not in str(failure.value)


def test_text_progress_draws_one_line_that_ends_full() -> None:
    out = io.StringIO()
    bar = TextProgress(4, out)
    bar(1, "usage/completions page 1")
    bar(9, "more pages than guessed")
    bar.finish("3 provider rows")
    drawn = out.getvalue()
    assert " 25%" in drawn and " 99%" in drawn and "100%  3 provider rows" in drawn and drawn.endswith("\n")
