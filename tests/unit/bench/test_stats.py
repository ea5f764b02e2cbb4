"""The benchmark's pure helpers: percentiles, run summaries, gateway-minus-direct,
and the stream check that times the first content chunk."""

from __future__ import annotations

import math

import orjson
import pytest

from bench.http1 import ProtocolError, parse_head
from bench.loadgen import StreamCheck
from bench.report import markdown_table
from bench.stats import RunSamples, added_latency, paired_differences, percentile, summarize


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_summary_reports_rate_milliseconds_and_errors() -> None:
    samples = RunSamples(latencies_s=[0.001 * i for i in range(1, 101)], ttfts_s=[0.002, 0.004], elapsed_s=2.0)
    samples.add_error("http_500")
    samples.add_error("http_500")
    samples.add_error("TimeoutError")
    summary = summarize(samples)
    assert summary["completed"] == 100 and summary["rps"] == 50.0
    assert summary["p50_ms"] == pytest.approx(50.5) and summary["p99_ms"] == pytest.approx(99.01)
    assert summary["p999_ms"] == pytest.approx(99.901) and summary["max_ms"] == pytest.approx(100.0)
    assert summary["ttft_p50_ms"] == pytest.approx(3.0)
    assert summary["errors"] == 3 and summary["error_kinds"] == {"TimeoutError": 1, "http_500": 2}


def test_summary_of_an_empty_run_has_no_latencies() -> None:
    summary = summarize(RunSamples(elapsed_s=0.0))
    assert summary["rps"] == 0.0 and math.isnan(summary["p50_ms"]) and math.isnan(summary["ttft_p50_ms"])
    assert math.isnan(summary["max_ms"])


def test_added_latency_is_gateway_minus_direct() -> None:
    direct = {"p50_ms": 1.0, "p99_ms": 4.0, "ttft_p50_ms": math.nan, "rps": 1000.0}
    gateway = {"p50_ms": 3.5, "p99_ms": 10.0, "ttft_p50_ms": math.nan, "rps": 250.0}
    added = added_latency(direct, gateway)
    assert added["added_p50_ms"] == 2.5 and added["added_p99_ms"] == 6.0
    assert added["throughput_ratio"] == 0.25 and math.isnan(added["added_ttft_p50_ms"])


def test_paired_differences_take_each_round_against_its_own_baseline() -> None:
    # The baseline drifts from 1.0 to 3.0; each round's difference stays 0.5, except one.
    pairs = [(1.0, 1.5), (2.0, 2.5), (3.0, 3.5), (1.5, 2.0), (2.5, 4.5)]
    figures = paired_differences(pairs)
    assert figures["median"] == 0.5 and figures["q25"] == 0.5 and figures["q75"] == 0.5
    assert figures["pooled"] == 2.5 - 2.0  # the pooled medians mix the drift back in
    assert all(math.isnan(v) for v in paired_differences([]).values())


def _event(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def test_stream_check_times_the_first_non_empty_content_and_sees_done() -> None:
    ticks = iter([1.0, 2.0, 3.0])
    check = StreamCheck(clock=lambda: next(ticks))
    role_only = _event({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    content = _event({"choices": [{"delta": {"content": "Hi"}}]})
    check.feed(role_only + content[:10])  # an event split across chunks
    assert check.first_content_at is None
    check.feed(content[10:])
    assert check.first_content_at == 1.0
    check.feed(_event({"choices": [{"delta": {"content": " there"}}]}))
    assert check.first_content_at == 1.0 and not check.done
    check.feed(b"data: [DONE]\n\n")
    assert check.done


def test_http_head_parsing() -> None:
    status, headers = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked")
    assert status == 200 and headers == {"content-length": "5", "transfer-encoding": "chunked"}
    with pytest.raises(ProtocolError):
        parse_head(b"garbage")


def test_markdown_table_prints_missing_values_as_dashes() -> None:
    table = markdown_table([("a", "a"), ("b", "b")], [{"a": 1234.5, "b": math.nan}, {"a": 0.25}])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1,234.5 | - |", "| 0.25 | - |"]
