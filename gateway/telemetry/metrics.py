"""Prometheus metrics on a per-app registry (no module globals). Labels are bounded:
tenant and model names come from the policy, status is a small fixed set.

Which tenants call, and how much, is not for anyone who can reach /metrics: rendered
without tenants, each series with a `tenant` label is summed over tenants instead."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gateway.telemetry.loop_metrics import LoopCounter, LoopHistogram, LoopMetricsCollector, LoopMoneyCounter

TENANT = "tenant"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # Updated by every answered call: loop metrics (telemetry/loop_metrics.py), not prometheus_client children.
        self.requests = LoopCounter("gateway_requests", "Client requests by outcome", ["tenant", "model", "status"])
        self.attempts = LoopCounter("gateway_upstream_attempts", "Upstream attempts by outcome", ["upstream", "model", "outcome"])
        self.ttft = LoopHistogram("gateway_time_to_first_token_seconds", "Enqueue to first token", ["model"], LATENCY_BUCKETS)
        self.tpot = LoopHistogram("gateway_time_per_output_token_seconds", "Decode time per output token", ["model"], TPOT_BUCKETS)
        self.e2e = LoopHistogram("gateway_request_duration_seconds", "Enqueue to end", ["model"], LATENCY_BUCKETS)
        self.upstream_latency = LoopHistogram("gateway_upstream_latency_seconds", "Upstream start to last byte", ["upstream"], LATENCY_BUCKETS)
        self.tokens = LoopCounter("gateway_tokens", "Tokens reported by upstreams", ["tenant", "model", "kind"])
        self.estimate_error = LoopHistogram("gateway_prompt_estimate_ratio", "Reported / estimated prompt tokens", ["model"],
                                        (0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0))
        self.cache = LoopCounter("gateway_response_cache", "Response cache outcomes", ["tenant", "result"])
        # What each model call's attempts cost, as booked to the ledger (exact pico-dollars inside).
        self.cost = LoopMoneyCounter("gateway_cost_usd", "Cost of model calls booked to the ledger, USD", ["tenant", "model"])
        r.register(LoopMetricsCollector([t for t in vars(self).values() if isinstance(t, LoopCounter | LoopHistogram)]))
        # Rare events: plain prometheus_client metrics.
        self.policy_reloads = Counter("gateway_policy_reloads", "Policy reloads by result", ["result"], registry=r)
        self.volatile_prefix = Counter("gateway_prompt_prefix_volatile", "Prompts whose prefix holds volatile content",
                                       ["tenant", "kind"], registry=r)
        self.escalations = Counter("gateway_escalations", "Route escalations by verifiable reason", ["route", "reason"], registry=r)
        # Read at each scrape, from the count `watch_in_flight` names (none yet: zero).
        self.in_flight = Gauge("gateway_requests_in_flight", "Requests being served", registry=r)
        self.in_flight.set_function(lambda: 0)
        ProcessCollector(registry=r)  # CPU, memory, open files of this process
        self._without_tenants = CollectorRegistry(auto_describe=False)
        self._without_tenants.register(WithoutTenants(r))

    def watch_in_flight(self, count: Callable[[], int]) -> None:
        """Requests in flight, as the pipeline counts them (Pipeline.serving): metrics
        only read the count; the pipeline, which acts on it, keeps it."""
        self.in_flight.set_function(count)

    def watch_ledger(self, commits: Callable[[], int], operations: Callable[[], int]) -> None:
        """The ledger writer's commits and the operations they carried, read at each scrape."""
        self.registry.register(_LedgerCounts(commits, operations))

    def render(self, *, with_tenants: bool) -> bytes:
        return generate_latest(self.registry if with_tenants else self._without_tenants)


class WithoutTenants(Collector):
    """A registry's families with the tenant label summed away (a `_created` sample
    keeps the earliest time): the same totals, per model or status, for no one tenant."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            yield _summed_over_tenants(family) if any(TENANT in s.labels for s in family.samples) else family

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the names are the registry's own; nothing to reserve here


class _LedgerCounts(Collector):
    def __init__(self, commits: Callable[[], int], operations: Callable[[], int]) -> None:
        self._commits, self._operations = commits, operations

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("gateway_ledger_commits", "Ledger transactions committed", value=self._commits())
        yield CounterMetricFamily("gateway_ledger_operations", "Holds, settlements and other ledger writes committed",
                                  value=self._operations())


def _summed_over_tenants(family: Metric) -> Metric:
    summed = Metric(family.name, family.documentation, family.type, family.unit)
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sample in family.samples:
        key = (sample.name, tuple((k, v) for k, v in sample.labels.items() if k != TENANT))
        known = values.get(key)
        if known is None:
            values[key] = sample.value
        else:
            values[key] = min(known, sample.value) if sample.name.endswith("_created") else known + sample.value
    summed.samples = [Sample(name, dict(labels), value) for (name, labels), value in values.items()]
    return summed
