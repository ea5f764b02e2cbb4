"""The tallies must export exactly what prometheus_client's own metrics would."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.telemetry.loop_metrics import LoopCounter, LoopHistogram, LoopMetricsCollector
from gateway.telemetry.metrics import LATENCY_BUCKETS, Metrics

CREATED = re.compile(r"^(\S+_created(?:\{[^}]*\})?) \S+$", re.MULTILINE)


def _without_created_values(text: bytes) -> str:
    """The `_created` series stay, their values (creation times) go."""
    return CREATED.sub(r"\1 T", text.decode())


def test_counters_and_histograms_render_as_prometheus_clients_own() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counter = Counter("gateway_requests", "Client requests by outcome", ["tenant", "model", "status"], registry=theirs)
    histogram = Histogram("gateway_request_duration_seconds", "Enqueue to end", ["model"], buckets=LATENCY_BUCKETS,
                          registry=theirs)
    count = LoopCounter("gateway_requests", "Client requests by outcome", ["tenant", "model", "status"])
    times = LoopHistogram("gateway_request_duration_seconds", "Enqueue to end", ["model"], LATENCY_BUCKETS)
    ours.register(LoopMetricsCollector([count, times]))

    for labels, amount in ((("acme", "small", "ok"), 1), (("acme", "small", "ok"), 2), (("beta", "large", "429"), 1)):
        counter.labels(*labels).inc(amount)
        count.inc(labels, amount)
    # Bounds themselves, between them, below the first and past the last.
    for model, value in (("small", 0.005), ("small", 0.0007), ("small", 0.3), ("large", 1.0), ("large", 999.0)):
        histogram.labels(model).observe(value)
        times.observe((model,), value)

    assert _without_created_values(generate_latest(ours)) == _without_created_values(generate_latest(theirs))


def test_a_value_on_a_bound_counts_in_that_bucket() -> None:
    times = LoopHistogram("t", "t", [], (0.1, 1.0))
    for value in (0.1, 0.1000001, 1.0, 5.0):
        times.observe((), value)
    samples = {(s.name, s.labels.get("le")): s.value for s in times.family().samples}
    assert samples[("t_bucket", "0.1")] == 1
    assert samples[("t_bucket", "1.0")] == 3
    assert samples[("t_bucket", "+Inf")] == 4 == samples[("t_count", None)]
    assert samples[("t_sum", None)] == pytest.approx(6.2000001)
    assert times.count(()) == 4


def test_wrong_labels_and_a_negative_count_are_refused() -> None:
    count = LoopCounter("c", "c", ["tenant"])
    with pytest.raises(ValueError, match=r"takes the labels \['tenant'\]"):
        count.inc(("acme", "extra"))
    with pytest.raises(ValueError, match="only go up"):
        count.inc(("acme",), -1)
    count.inc(("acme",), 2)
    with pytest.raises(ValueError, match="only go up"):
        count.inc(("acme",), -1)
    assert count.value(("acme",)) == 2
    with pytest.raises(ValueError, match="takes the labels"):
        LoopHistogram("t", "t", ["model"], (1.0,)).observe((), 0.5)
    with pytest.raises(ValueError, match="buckets must be distinct"):
        LoopHistogram("t", "t", [], (1.0, 1.0))


def test_every_family_is_exported_before_any_call() -> None:
    names = {family.name for family in Metrics().registry.collect()}
    assert {"gateway_requests", "gateway_upstream_attempts", "gateway_tokens", "gateway_time_to_first_token_seconds",
            "gateway_request_duration_seconds", "gateway_requests_in_flight", "gateway_policy_reloads"} <= names


def test_requests_in_flight_is_read_at_scrape_time() -> None:
    metrics = Metrics()
    serving = [3]
    metrics.watch_in_flight(lambda: serving[0])
    assert b"gateway_requests_in_flight 3.0" in metrics.render(with_tenants=True)
    serving[0] = 0
    assert b"gateway_requests_in_flight 0.0" in metrics.render(with_tenants=True)
