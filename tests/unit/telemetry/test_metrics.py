"""/metrics without the metrics key: the totals, not who called."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.metrics import Metrics


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def busy_metrics() -> Metrics:
    metrics = Metrics()
    for tenant, amount in (("acme", 2), ("globex", 3)):
        metrics.requests.inc((tenant, "small", "ok"), amount)
        metrics.tokens.inc((tenant, "small", "output"), 10 * amount)
        metrics.cache.inc((tenant, "hit"))
        metrics.volatile_prefix.labels(tenant, "timestamp").inc()
    metrics.requests.inc(("acme", "large", "429"))
    metrics.attempts.inc(("hosted", "small", "ok"), 5)
    return metrics


def test_without_tenants_every_tenant_series_is_summed_over_tenants() -> None:
    text = busy_metrics().render(with_tenants=False)
    assert b"tenant" not in text and b"acme" not in text and b"globex" not in text
    found = samples(text)
    assert found[("gateway_requests_total", (("model", "small"), ("status", "ok")))] == 5
    assert found[("gateway_requests_total", (("model", "large"), ("status", "429")))] == 1
    assert found[("gateway_tokens_total", (("kind", "output"), ("model", "small")))] == 50
    assert found[("gateway_response_cache_total", (("result", "hit"),))] == 2
    assert found[("gateway_prompt_prefix_volatile_total", (("kind", "timestamp"),))] == 2
    assert found[("gateway_upstream_attempts_total", (("model", "small"), ("outcome", "ok"), ("upstream", "hosted")))] == 5
    assert ("gateway_requests_created", (("model", "small"), ("status", "ok"))) in found
    assert any(name == "process_cpu_seconds_total" for name, _ in found), "the process's own series are there"


def test_with_tenants_each_tenant_has_its_own_series() -> None:
    found = samples(busy_metrics().render(with_tenants=True))
    assert found[("gateway_requests_total", (("model", "small"), ("status", "ok"), ("tenant", "acme")))] == 2
    assert found[("gateway_requests_total", (("model", "small"), ("status", "ok"), ("tenant", "globex")))] == 3


def test_the_ledger_writer_s_commits_are_counted_at_each_scrape() -> None:
    metrics = Metrics()
    counts = {"commits": 3, "ops": 10}
    metrics.watch_ledger(lambda: counts["commits"], lambda: counts["ops"])
    counts["commits"], counts["ops"] = 4, 12
    text = metrics.render(with_tenants=False).decode()
    assert "gateway_ledger_commits_total 4.0" in text and "gateway_ledger_operations_total 12.0" in text


def test_cost_is_counted_exactly_and_shown_in_usd_per_tenant_only_with_the_key() -> None:
    metrics = Metrics()
    # A tenth of a micro-dollar, a million times: a float sum would drift, pico-dollars do not.
    for _ in range(1_000_000):
        metrics.cost.inc(("acme", "small"), 100_000)
    metrics.cost.inc(("globex", "small"), 2_500_000_000_000)
    assert metrics.cost.pico(("acme", "small")) == 10**11
    with_tenants = samples(metrics.render(with_tenants=True))
    assert with_tenants[("gateway_cost_usd_total", (("model", "small"), ("tenant", "acme")))] == 0.1
    assert with_tenants[("gateway_cost_usd_total", (("model", "small"), ("tenant", "globex")))] == 2.5
    without = samples(metrics.render(with_tenants=False))
    assert without[("gateway_cost_usd_total", (("model", "small"),))] == 2.6
    assert not any(name.startswith("gateway_cost") and dict(labels).get("tenant") for name, labels in without)


def test_cost_counts_whole_pico_dollars_only() -> None:
    metrics = Metrics()
    for wrong in (-1, 0.5):
        with pytest.raises(ValueError, match="pico-dollars"):
            metrics.cost.inc(("acme", "small"), wrong)
