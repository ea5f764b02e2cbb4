"""The simulated vLLM engine: config, KV blocks, scheduling, latency and metrics.

One request's life: wait for a slot and KV blocks (queue time), prefill the uncached
prompt tokens (`prefill_s_per_token` each), then decode (`decode_s_per_token` per
token). A client disconnect at any point aborts it and frees its blocks, counted as
`finished_reason="abort"`, as vLLM does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.sim.asgi import DisconnectWatch, Receive, RequestStats
from gateway.sim.kv_events import KvEventsConfig, ZmqPublisher
from gateway.sim.prefix_cache import PrefixCache
from gateway.sim.vllm_metrics import VllmMetrics
from gateway.sim.vllm_scheduler import Scheduler


@dataclass
class VllmSimConfig:
    model: str = "pool-model"
    served_model_names: list[str] = field(default_factory=list)  # empty: just `model`
    seed: int = 0
    output_tokens: int = 20
    block_size: int = 16
    num_gpu_blocks: int = 4096
    enable_prefix_caching: bool = True
    enable_prompt_tokens_details: bool = False  # like --enable-prompt-tokens-details
    enable_force_include_usage: bool = False
    max_num_seqs: int = 64
    max_model_len: int = 32768
    prefill_s_per_token: float = 0.0
    decode_s_per_token: float = 0.0
    kv_events: KvEventsConfig | None = None  # publish KV events over ZMQ (--kv-events-config)

    @property
    def names(self) -> list[str]:
        return self.served_model_names or [self.model]


@dataclass
class VllmSimStats(RequestStats):
    finished: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    last_cached_tokens: int = 0


@dataclass
class EngineRequest:
    request_id: str
    prompt_ids: list[int]
    block_hashes: list[bytes]
    completion_tokens: int  # across all choices; decides KV blocks and decode time
    decode_steps: int  # longest choice: choices decode in parallel
    arrival: float = field(default_factory=time.monotonic)
    cached_tokens: int = 0
    generated: int = 0
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    watch: DisconnectWatch | None = None
    done: bool = False  # finished or aborted: blocks freed and counted exactly once

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()


class VllmEngine:
    def __init__(self, config: VllmSimConfig) -> None:
        self.config = config
        self.stats = VllmSimStats()
        self.metrics = self._new_metrics()
        self.publisher = ZmqPublisher(config.kv_events) if config.kv_events is not None else None
        self.cache = self._new_cache()
        self.scheduler = Scheduler(config.max_num_seqs)

    def _new_metrics(self) -> VllmMetrics:
        cfg = self.config
        metrics = VllmMetrics(cfg.names[0])
        metrics.set_cache_config(cfg.block_size, cfg.num_gpu_blocks, cfg.enable_prefix_caching)
        return metrics

    def _new_cache(self) -> PrefixCache:
        cfg = self.config
        return PrefixCache(cfg.num_gpu_blocks, cfg.block_size, cfg.enable_prefix_caching, [] if self.publisher is not None else None)

    def publish_events(self) -> None:
        """What the cache recorded since the last call, as one batch (vLLM publishes once
        per engine step)."""
        events = self.cache.events
        if self.publisher is not None and events:
            self.publisher.publish(events[:])
            events.clear()

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()

    def reconfigure(self) -> bool:
        """Apply a patched config; the KV pool can only be rebuilt while idle."""
        cfg = self.config
        self.scheduler.max_running = cfg.max_num_seqs
        self.scheduler.admit_waiting()
        geometry = (cfg.num_gpu_blocks, cfg.block_size)
        if geometry != (self.cache.num_blocks, self.cache.block_size):
            if self.scheduler.running or self.scheduler.waiting:
                return False
            self.cache.reset()  # subscribers learn the old blocks are gone
            self.publish_events()
            self.cache = self._new_cache()
        self.cache.enabled = cfg.enable_prefix_caching
        self.metrics.set_cache_config(cfg.block_size, cfg.num_gpu_blocks, cfg.enable_prefix_caching)
        return True

    def reset(self) -> None:
        self.stats = VllmSimStats()
        self.metrics = self._new_metrics()
        self.cache.reset()
        self.publish_events()

    def snapshot(self) -> dict[str, Any]:
        out = dataclasses.asdict(self.stats)
        out.update(
            running=self.scheduler.running,
            waiting=self.scheduler.waiting,
            kv_cache_usage=self.cache.usage,
            cached_blocks=self.cache.cached_blocks,
        )
        return out

    def fits(self, num_tokens: int) -> bool:
        return self.cache.blocks_needed(num_tokens) <= self.cache.num_blocks

    async def _pause(self, request: EngineRequest, receive: Receive, delay: float) -> bool:
        """Sleep `delay`; True if the client disconnected (the request must abort)."""
        if delay <= 0:
            return request.watch is not None and request.watch.disconnected
        if request.watch is None:
            request.watch = DisconnectWatch(receive)
        return await request.watch.sleep(delay)

    async def start(self, request: EngineRequest, receive: Receive) -> bool:
        """Queue, admit and prefill; False if the client went away first (already aborted)."""
        def allocate() -> int | None:
            total = request.prompt_tokens + request.completion_tokens
            return self.cache.allocate(request.request_id, request.block_hashes, request.prompt_tokens, total, request.prompt_ids)

        cached = self.scheduler.try_admit(allocate)
        if cached is None:
            if request.watch is None:
                request.watch = DisconnectWatch(receive)
            admitted = self.scheduler.enqueue(allocate)
            await asyncio.wait((admitted, request.watch.future), return_when=asyncio.FIRST_COMPLETED)
            if request.watch.disconnected and not self.scheduler.abandon(admitted):
                self._count_abort(request)
                return False
            cached = admitted.result()
        self.publish_events()  # the blocks its allocation evicted
        request.admitted_at = time.monotonic()
        request.cached_tokens = cached
        uncached = request.prompt_tokens - cached
        if await self._pause(request, receive, uncached * self.config.prefill_s_per_token):
            self.finish(request, "abort")
            return False
        self.cache.commit(request.request_id)
        self.publish_events()
        request.first_token_at = time.monotonic()
        return True

    async def decode_step(self, request: EngineRequest, receive: Receive) -> bool:
        """Wait one decode step (all choices advance together); False if aborted."""
        if await self._pause(request, receive, self.config.decode_s_per_token):
            self.finish(request, "abort")
            return False
        return True

    async def decode_all(self, request: EngineRequest, receive: Receive) -> bool:
        """Non-streaming: the whole decode as one wait; False if aborted."""
        steps = max(request.decode_steps - 1, 0)  # the first token came out of prefill
        if await self._pause(request, receive, steps * self.config.decode_s_per_token):
            self.finish(request, "abort")
            return False
        request.generated = request.completion_tokens
        return True

    def _count_abort(self, request: EngineRequest) -> None:
        request.done = True
        self.stats.aborted += 1
        self.metrics.finished("abort")
        request.close()

    def finish(self, request: EngineRequest, reason: str) -> None:
        """Free the request's blocks and book its tokens and latencies."""
        if request.done:
            return
        now = time.monotonic()
        self.cache.free(request.request_id)
        self.scheduler.finish()
        self.publish_events()  # admitting the next in line may have evicted blocks
        m, s = self.metrics, self.stats
        if reason == "abort":
            self._count_abort(request)
        else:
            request.done = True
            s.finished += 1
            m.finished(reason)
            request.close()
        s.prompt_tokens += request.prompt_tokens
        s.cached_tokens += request.cached_tokens
        s.completion_tokens += request.generated
        s.last_cached_tokens = request.cached_tokens
        m.prompt_tokens.inc(request.prompt_tokens)
        m.cache_queries.inc(request.prompt_tokens if self.cache.enabled else 0)
        m.cache_hits.inc(request.cached_tokens)
        m.generation_tokens.inc(request.generated)
        m.queue_time.observe(request.admitted_at - request.arrival)
        if request.first_token_at:
            m.prefill_time.observe(request.first_token_at - request.admitted_at)
            m.ttft.observe(request.first_token_at - request.arrival)
            m.decode_time.observe(now - request.first_token_at)
            steps = min(request.generated, request.decode_steps) - 1
            for _ in range(steps):  # one observation per inter-token gap, as vLLM counts them
                m.itl.observe((now - request.first_token_at) / steps)
        m.e2e.observe(now - request.arrival)
