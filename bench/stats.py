"""Percentiles and per-run summaries: pure functions over recorded samples."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default method); NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class RunSamples:
    """What one closed-loop run recorded; latencies in seconds, successes only."""

    latencies_s: list[float] = field(default_factory=list)
    ttfts_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def add_error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    @property
    def completed(self) -> int:
        return len(self.latencies_s)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3) if not math.isnan(seconds) else math.nan


def summarize(samples: RunSamples) -> dict[str, Any]:
    """Requests/s, latency percentiles and the slowest call (ms), TTFT p50 (ms; NaN
    without streams), errors. The far tail shows pauses that stall every call in
    flight (a full garbage collection), which p99 at c=16 blurs with queueing."""
    lat = samples.latencies_s
    return {
        "completed": samples.completed,
        "errors": sum(samples.errors.values()),
        "error_kinds": dict(sorted(samples.errors.items())),
        "elapsed_s": round(samples.elapsed_s, 3),
        "rps": round(samples.completed / samples.elapsed_s, 2) if samples.elapsed_s > 0 else 0.0,
        "p50_ms": _ms(percentile(lat, 50)),
        "p90_ms": _ms(percentile(lat, 90)),
        "p99_ms": _ms(percentile(lat, 99)),
        "p999_ms": _ms(percentile(lat, 99.9)),
        "max_ms": _ms(max(lat, default=math.nan)),
        "ttft_p50_ms": _ms(percentile(samples.ttfts_s, 50)),
    }


def added_latency(direct: Mapping[str, Any], gateway: Mapping[str, Any]) -> dict[str, float]:
    """What the gateway adds over the direct run at the same mode and concurrency:
    latency differences (ms) and the gateway/direct throughput ratio."""

    def diff(key: str) -> float:
        return round(float(gateway[key]) - float(direct[key]), 3)

    ratio = float(gateway["rps"]) / float(direct["rps"]) if direct["rps"] else math.nan
    return {
        "added_p50_ms": diff("p50_ms"),
        "added_p99_ms": diff("p99_ms"),
        "added_ttft_p50_ms": diff("ttft_p50_ms"),
        "throughput_ratio": round(ratio, 3),
    }


def paired_differences(pairs: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Of (baseline, measured) pairs taken side by side: the median and quartiles of
    `measured - baseline`, and the difference of the pooled medians, in the pairs' unit
    (all NaN if empty)."""
    differences = [measured - baseline for baseline, measured in pairs]
    return {
        "median": percentile(differences, 50),
        "q25": percentile(differences, 25),
        "q75": percentile(differences, 75),
        "pooled": percentile([m for _, m in pairs], 50) - percentile([b for b, _ in pairs], 50),
    }
