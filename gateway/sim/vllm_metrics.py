"""vLLM's Prometheus metrics, with its real names, on a per-app registry.

prometheus_client appends `_total` to counters itself, so counters are declared
without the suffix and exported as e.g. `vllm:prompt_tokens_total`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Bucket edges as in vLLM's own metrics module.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
LABELS = ("model_name", "engine")
FINISHED_REASONS = ("stop", "length", "abort")
CACHE_CONFIG_LABELS = ("block_size", "cache_dtype", "enable_prefix_caching", "engine", "gpu_memory_utilization", "num_cpu_blocks",
                       "num_gpu_blocks", "prefix_caching_hash_algo")


class VllmMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=self.registry, multiprocess_mode="mostrecent")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.").labels(**labels)
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.").labels(**labels)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.").labels(**labels)
        self.cache_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.").labels(**labels)
        self.cache_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.").labels(**labels)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(**labels)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.").labels(**labels)
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.").labels(**labels)
        success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", (*LABELS, "finished_reason"), registry=self.registry
        )
        self.success = {r: success.labels(finished_reason=r, **labels) for r in FINISHED_REASONS}
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS).labels(**labels)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS).labels(**labels)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS).labels(**labels)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQUEST_BUCKETS).labels(**labels)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", REQUEST_BUCKETS).labels(**labels)
        # An info gauge, as vLLM's: value 1, the KV cache's configuration in its labels.
        self._cache_config = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", CACHE_CONFIG_LABELS,
                                   registry=self.registry, multiprocess_mode="mostrecent")
        self.decode_time = histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQUEST_BUCKETS).labels(**labels)

    def set_cache_config(self, block_size: int, num_gpu_blocks: int, enable_prefix_caching: bool) -> None:
        self._cache_config.clear()
        self._cache_config.labels(
            block_size=str(block_size), cache_dtype="auto", enable_prefix_caching=str(enable_prefix_caching), engine="0",
            gpu_memory_utilization="0.9", num_cpu_blocks="None", num_gpu_blocks=str(num_gpu_blocks),
            prefix_caching_hash_algo="sha256",
        ).set(1)

    def finished(self, reason: str) -> None:
        self.success[reason if reason in self.success else "stop"].inc()

    def render(self, running: int, waiting: int, kv_usage: float) -> bytes:
        """Text exposition; the gauges are sampled from the live state at scrape time."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        return generate_latest(self.registry)
