"""Counters and histograms that every answered call updates, kept by the event loop
(their only writer) without prometheus_client's per-update cost.

A prometheus_client child validates that it may be observed and takes a lock on every
update, and finding the child for a label set is a call of its own; a call makes about
nine such updates. Here a label set's value is a plain entry in a dict, updated with a lookup and an addition, on the event
loop (the only writer). A scrape - on the same loop, through the registry's collector -
turns them into the metric families prometheus_client itself would write: same names,
types, label order, bucket bounds and `_created` series.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import INF, floatToGoString

Labels = tuple[str, ...]


class LoopCounter:
    """A counter family: `inc(labels, amount)`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self._values: dict[Labels, float] = {}
        self._created: dict[Labels, float] = {}

    def inc(self, labels: Labels, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: counters only go up, not by {amount}")
        value = self._values.get(labels)
        if value is None:
            _check_labels(self.name, self.labelnames, labels)
            self._created[labels] = time.time()
            value = 0
        self._values[labels] = value + amount

    def value(self, labels: Labels) -> float:
        return self._values.get(labels, 0)

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in list(self._values.items()):
            family.add_metric(list(labels), self._exported(value), created=self._created[labels])
        return family

    def _exported(self, value: float) -> float:
        return value


class LoopMoneyCounter(LoopCounter):
    """A counter of money: `inc(labels, pico_dollars)` adds exact integers (an int
    plus an int stays one), and a scrape shows each total in USD (pico-dollars / 1e12).
    Only the exported value is a float, so a long-running total never drifts from the
    ledger's sum."""

    PICO_PER_USD = 10**12

    def inc(self, labels: Labels, amount: float = 1) -> None:
        if not isinstance(amount, int) or amount < 0:
            raise ValueError(f"{self.name}: counts whole, non-negative pico-dollars, not {amount!r}")
        super().inc(labels, amount)

    def pico(self, labels: Labels) -> int:
        return int(self._values.get(labels, 0))

    def value(self, labels: Labels) -> float:
        return self._exported(self._values.get(labels, 0))

    def _exported(self, value: float) -> float:
        return value / self.PICO_PER_USD


class LoopHistogram:
    """A histogram family: `observe(labels, value)`. Buckets count values <= their bound."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        bounds = sorted(float(b) for b in buckets)
        if bounds and bounds[-1] == INF:
            bounds.pop()
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: buckets must be distinct, with at least one below +Inf")
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self._bounds = tuple(bounds)
        self._les = [floatToGoString(b) for b in bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        # Per label set: one count per bucket (the last is +Inf's own), then the sum.
        self._cells: dict[Labels, list[float]] = {}
        self._created: dict[Labels, float] = {}

    def observe(self, labels: Labels, value: float) -> None:
        cell = self._cells.get(labels)
        if cell is None:
            _check_labels(self.name, self.labelnames, labels)
            cell = self._cells[labels] = [0] * (len(self._bounds) + 2)
            self._created[labels] = time.time()
        cell[bisect_left(self._bounds, value)] += 1
        cell[-1] += value

    def count(self, labels: Labels) -> int:
        cell = self._cells.get(labels)
        return 0 if cell is None else int(sum(cell[:-1]))

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, cell in list(self._cells.items()):
            running, buckets = 0.0, []
            for le, count in zip(self._les, cell[:-1], strict=True):
                running += count
                buckets.append((le, running))
            family.add_metric(list(labels), buckets, cell[-1])
            family.samples.append(Sample(f"{self.name}_created", dict(zip(self.labelnames, labels, strict=True)),
                                         self._created[labels]))
        return family


def _check_labels(name: str, labelnames: list[str], labels: Labels) -> None:
    """Once per new label set, as prometheus_client checks them on `labels()`."""
    if len(labels) != len(labelnames):
        raise ValueError(f"{name} takes the labels {labelnames}, not {labels!r}")


class LoopMetricsCollector(Collector):
    """Hands the registry these metrics' families at each scrape (and, empty, when it
    asks what this collector will export)."""

    def __init__(self, metrics: Sequence[LoopCounter | LoopHistogram]) -> None:
        self._metrics = tuple(metrics)

    def collect(self) -> Iterator[Metric]:
        for metric in self._metrics:
            yield metric.family()

    def describe(self) -> Iterator[Metric]:
        for metric in self._metrics:
            kind = CounterMetricFamily if isinstance(metric, LoopCounter) else HistogramMetricFamily
            yield kind(metric.name, metric.documentation, labels=metric.labelnames)
