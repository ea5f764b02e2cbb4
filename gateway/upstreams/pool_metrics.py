"""A vLLM replica's `/metrics`, read into what the router needs (PROTOCOLS.md names):
load gauges, KV use, prefix-cache counters, token counters, the latency sums that give
how long a request holds a slot, and `vllm:cache_config_info`'s block geometry. Values
are summed over a replica's engines and served model names."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

_SUMMED = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:e2e_request_latency_seconds_sum": "e2e_sum",
    "vllm:e2e_request_latency_seconds_count": "e2e_count",
    "vllm:request_queue_time_seconds_sum": "queue_sum",
    "vllm:request_prefill_time_seconds_sum": "prefill_sum",
}
KV_USAGE = "vllm:kv_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"


@dataclass(slots=True)
class ReplicaMetrics:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # the highest over the replica's engines
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    e2e_sum: float = 0.0
    e2e_count: float = 0.0
    queue_sum: float = 0.0
    prefill_sum: float = 0.0
    block_size: int | None = None
    num_gpu_blocks: int | None = None


def parse_replica_metrics(text: str) -> ReplicaMetrics:
    out = ReplicaMetrics()
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        field = _SUMMED.get(name)
        if field is not None:
            setattr(out, field, getattr(out, field) + value)
        elif name == KV_USAGE:
            out.kv_usage = max(out.kv_usage, value)
        elif name == CACHE_CONFIG:
            found = dict(_LABEL.findall(labels or ""))
            out.block_size = _positive(found.get("block_size")) or out.block_size
            out.num_gpu_blocks = _positive(found.get("num_gpu_blocks")) or out.num_gpu_blocks
    return out


def _positive(raw: str | None) -> int | None:
    try:
        value = int(raw) if raw is not None else 0
    except ValueError:
        return None
    return value if value > 0 else None
