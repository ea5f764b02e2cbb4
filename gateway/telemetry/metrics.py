"""Prometheus metrics on a per-app registry (no module globals). Labels are bounded:
tenant and model names come from the policy, status is a small fixed set."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("gateway_requests", "Client requests by outcome", ["tenant", "model", "status"], registry=r)
        self.attempts = Counter("gateway_upstream_attempts", "Upstream attempts by outcome", ["upstream", "model", "outcome"], registry=r)
        self.ttft = Histogram("gateway_time_to_first_token_seconds", "Enqueue to first token", ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("gateway_time_per_output_token_seconds", "Decode time per output token", ["model"], buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("gateway_request_duration_seconds", "Enqueue to end", ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_latency = Histogram("gateway_upstream_latency_seconds", "Upstream start to last byte", ["upstream"], buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("gateway_tokens", "Tokens reported by upstreams", ["tenant", "model", "kind"], registry=r)
        self.estimate_error = Histogram(
            "gateway_prompt_estimate_ratio", "Reported / estimated prompt tokens", ["model"],
            buckets=(0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0), registry=r,
        )
        self.policy_reloads = Counter("gateway_policy_reloads", "Policy reloads by result", ["result"], registry=r)
        self.cache = Counter("gateway_response_cache", "Response cache outcomes", ["tenant", "result"], registry=r)
        self.volatile_prefix = Counter("gateway_prompt_prefix_volatile", "Prompts whose prefix holds volatile content",
                                       ["tenant", "kind"], registry=r)
        self.escalations = Counter("gateway_escalations", "Route escalations by verifiable reason", ["route", "reason"], registry=r)
        self.in_flight = Gauge("gateway_requests_in_flight", "Requests being served", registry=r)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def of(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered: prometheus_client validates and locks on
        every `labels()` call, ~4 us each and ~10 per request. Label sets are bounded
        (policy names and fixed sets), so the memo is too."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def render(self) -> bytes:
        return generate_latest(self.registry)
