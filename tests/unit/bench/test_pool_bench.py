"""bench/pool.py's pure helpers: the tenants' traffic, the oracle's placement, one arm's
measures from the replicas' counters, and the issue's targets as checks."""

from __future__ import annotations

import math

from bench.pool import oracle_assignment, summarize, tenant_weights, verdict
from bench.trace_replay import Outcome
from gateway.upstreams.pool_metrics import ReplicaMetrics


def test_tenant_weights_are_zipf_shares() -> None:
    weights = tenant_weights(20, 0.8)
    assert math.isclose(sum(weights), 1.0)
    assert weights == sorted(weights, reverse=True)
    assert math.isclose(weights[0] / weights[1], 2**0.8)


def test_the_oracle_gives_each_tenant_one_replica_and_balances_their_traffic() -> None:
    weights = tenant_weights(20, 0.8)
    home = oracle_assignment(weights, 4)
    load = [sum(w for w, r in zip(weights, home, strict=True) if r == replica) for replica in range(4)]
    assert set(home) == {0, 1, 2, 3}
    assert max(load) - min(load) < weights[-1] * 2, "no replica heavier than another by more than a light tenant or two"
    assert oracle_assignment([0.7, 0.1, 0.1, 0.1], 2) == [0, 1, 1, 1], "the heaviest alone, the rest together"


def test_an_arm_is_measured_by_the_counters_moved_during_it() -> None:
    before = [ReplicaMetrics(prefix_queries=1000, prefix_hits=100, e2e_count=10), ReplicaMetrics()]
    after = [ReplicaMetrics(prefix_queries=3000, prefix_hits=1700, e2e_count=13), ReplicaMetrics(prefix_queries=2000, prefix_hits=1400, e2e_count=1)]
    outcomes = [Outcome(i, status=200, ttft_s=t) for i, t in enumerate([0.01, 0.02, 0.03, 0.5])]
    outcomes.append(Outcome(4, error="http_502"))
    arm = summarize(outcomes, before, after)
    assert math.isclose(arm["cached_share"], (1600 + 1400) / (2000 + 2000))
    assert arm["requests_per_replica"] == [3, 1] and arm["busiest_share"] == 0.75
    assert arm["cached_share_per_replica"] == [0.8, 0.7]
    assert arm["errors"] == 1 and arm["error_kinds"] == {"http_502": 1}
    assert 30 < arm["ttft_p95_ms"] <= 500


def _arm(cached: float, p95: float, busiest: float) -> dict[str, float]:
    return {"cached_share": cached, "ttft_p95_ms": p95, "busiest_share": busiest}


def test_the_verdict_holds_the_gateway_arms_to_the_issues_targets() -> None:
    arms = {"round-robin": _arm(0.40, 300, 0.25), "oracle": _arm(0.90, 60, 0.28),
            "gateway": _arm(0.85, 90, 0.33), "2 gateways": _arm(0.79, 220, 0.45)}
    checks = {c["check"]: c["met"] for c in verdict(arms)}
    assert checks["gateway: cached share / round-robin's"] and checks["gateway: cached share / oracle's"]
    assert checks["gateway: p95 TTFT / round-robin's"] and checks["gateway: busiest replica's share of requests"]
    assert not checks["2 gateways: p95 TTFT / round-robin's"]
    assert not checks["2 gateways: busiest replica's share of requests"]
    assert not checks["2 gateways: cached share / 1 gateway's"], "0.79 is not within 5 % of 0.85"
    assert not checks["2 gateways: cached share / oracle's"], "0.79 is not within 10 % of 0.90"
