"""Usage and Costs report pages built from billed records."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.sim.generation import SimRequestError
from gateway.sim.usage_report import UsageLedger, UsageRecord, api_key_id, costs_page, default_prices, usage_page

T0 = 1_700_000_000  # bucket-aligned for readability; buckets start at start_time either way


def ledger() -> UsageLedger:
    report = UsageLedger()
    report.add(UsageRecord(T0 + 10, "completions", "sim-small", "key_a", "req_1", 1000, 200, 100))
    report.add(UsageRecord(T0 + 20, "completions", "sim-large", "key_a", "req_2", 500, 0, 50))
    report.add(UsageRecord(T0 + 30, "completions", "sim-small", "key_b", "req_3", 300, 0, 30))
    report.add(UsageRecord(T0 + 3700, "completions", "sim-small", "key_a", "req_4", 10, 0, 1))
    report.add(UsageRecord(T0 + 40, "embeddings", "text-embedding-3-small", "key_a", "req_5", 7, 0, 0))
    return report


def q(**params: str) -> dict[str, list[str]]:
    return {k: [v] for k, v in params.items()}


def test_ungrouped_hourly_buckets_sum_everything_in_each_bucket() -> None:
    page = usage_page(ledger(), q(start_time=str(T0), end_time=str(T0 + 7200), bucket_width="1h"), "completions")
    assert [b["start_time"] for b in page["data"]] == [T0, T0 + 3600]
    [first] = page["data"][0]["results"]
    assert (first["input_tokens"], first["output_tokens"], first["input_cached_tokens"], first["num_model_requests"]) == (1800, 180, 200, 3)
    assert first["model"] is None and first["api_key_id"] is None
    assert page["has_more"] is False and page["next_page"] is None


def test_group_by_model_and_key() -> None:
    query = {"start_time": [str(T0)], "end_time": [str(T0 + 3600)], "bucket_width": ["1h"], "group_by": ["model,api_key_id"]}
    results = usage_page(ledger(), query, "completions")["data"][0]["results"]
    by = {(r["model"], r["api_key_id"]): r["input_tokens"] for r in results}
    assert by == {("sim-small", "key_a"): 1000, ("sim-large", "key_a"): 500, ("sim-small", "key_b"): 300}


def test_pagination() -> None:
    first = usage_page(ledger(), q(start_time=str(T0), end_time=str(T0 + 180), bucket_width="1m", limit="2"), "completions")
    assert len(first["data"]) == 2 and first["has_more"] is True
    second = usage_page(ledger(), q(start_time=str(T0), end_time=str(T0 + 180), bucket_width="1m", limit="2", page=first["next_page"]), "completions")
    assert [b["start_time"] for b in second["data"]] == [T0 + 120] and second["has_more"] is False


def test_embeddings_are_a_separate_report() -> None:
    page = usage_page(ledger(), q(start_time=str(T0), end_time=str(T0 + 60), bucket_width="1d"), "embeddings")
    assert page["data"][0]["results"][0]["input_tokens"] == 7


def test_costs_per_line_item() -> None:
    page = costs_page(ledger(), q(start_time=str(T0), end_time=str(T0 + 86400)), default_prices())
    amounts = {r["line_item"]: r["amount"]["value"] for r in page["data"][0]["results"]}
    small = (1000 - 200 + 300 + 10) * 0.15 + 200 * 0.075 + (100 + 30 + 1) * 0.60
    assert amounts["sim-small"] == pytest.approx(small / 1e6)
    assert amounts["sim-large"] == pytest.approx((500 * 2.50 + 50 * 10.0) / 1e6)
    assert page["data"][0]["results"][0]["amount"]["currency"] == "usd"


@pytest.mark.parametrize("query", [{}, q(start_time="x"), q(start_time=str(T0), bucket_width="2h"), q(start_time=str(T0), group_by="color")])
def test_bad_queries(query: dict[str, list[str]]) -> None:
    with pytest.raises(SimRequestError):
        usage_page(ledger(), query, "completions")


def test_omit_and_key_ids() -> None:
    report = ledger()
    assert report.omit("req_2") and not report.omit("req_2")
    assert api_key_id("Bearer sk-abc") == api_key_id("sk-abc") != api_key_id("sk-abd")
    assert api_key_id("Bearer sk-abc").startswith("key_") and len(api_key_id("sk-abc")) == 16


def test_a_journal_keeps_the_report_across_restarts(tmp_path: Path) -> None:
    journal = tmp_path / "sim" / "usage.jsonl"
    first = UsageLedger.kept_in(journal, UsageRecord)
    for record in ledger().records:
        first.add(record)
    assert first.omit("req_2")
    with journal.open("ab") as out:
        out.write(b'{"timestamp": 1700000099, "kind": "compl')  # a crash mid-line
    again = UsageLedger.kept_in(journal, UsageRecord)
    assert [r.request_id for r in again.records] == ["req_1", "req_3", "req_4", "req_5"]
    assert again.records[0] == ledger().records[0]
    page = usage_page(again, q(start_time=str(T0), end_time=str(T0 + 3600), bucket_width="1h"), "completions")
    assert page["data"][0]["results"][0]["num_model_requests"] == 2
    again.add(ledger().records[1])
    assert [r.request_id for r in UsageLedger.kept_in(journal, UsageRecord).records] == ["req_1", "req_3", "req_4", "req_5", "req_2"]
    again.clear()
    assert UsageLedger.kept_in(journal, UsageRecord).records == []
