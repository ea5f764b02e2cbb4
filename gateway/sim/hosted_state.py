"""Config, counters and per-app state of the hosted (OpenAI-compatible) simulator."""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.sim.asgi import RequestStats
from gateway.sim.hosted_cache import HostedPromptCache
from gateway.sim.hosted_faults import FaultRates
from gateway.sim.quality import QualityProfile, TruthLog
from gateway.sim.ratelimit import RateLimiter
from gateway.sim.usage_report import ModelPrice, UsageLedger, UsageRecord, default_prices


def _default_models() -> list[str]:
    return ["sim-small", "sim-large", "bench-model", "gpt-4o-mini", "text-embedding-3-small"]


@dataclass
class HostedSimConfig:
    models: list[str] = field(default_factory=_default_models)
    seed: int = 0
    output_tokens: int = 20  # completion length when the request sets no bound
    token_delay_s: float = 0.0  # between streamed chunks
    latency_s: float = 0.0  # before the first token / the response
    rpm: int | None = None
    tpm: int | None = None
    fail_429_rate: float = 0.0
    retry_after_s: float = 1.0
    fail_5xx_rate: float = 0.0
    # The message of injected 5xx errors; None: OpenAI's own. A provider behind its own
    # proxy or load balancer sometimes names internal endpoints or keys in it.
    server_error_message: str | None = None
    cut_stream_rate: float = 0.0  # streams dropped mid-way: no finish chunk, usage or [DONE]
    malformed_rate: float = 0.0  # 200 with a body that is not valid JSON
    prompt_caching: bool = True
    # Prompt tokens this provider's tokenizer counts per tiktoken token of the same text
    # (2.0: a tokenizer that splits finer). Usage, limits and the usage report all say
    # its count; prompts given as token ids are its own tokens and count as themselves.
    tokens_per_tiktoken: float = 1.0
    # Off by default: many OpenAI-compatible servers take no key, and DESIGN's minimal
    # policy names none. On, it answers 401 without a bearer key, as OpenAI does.
    require_auth: bool = False
    embedding_dims: int = 64
    prices: dict[str, ModelPrice] = field(default_factory=default_prices)
    # Model -> share of prompts it answers wrong (gateway.sim.quality); none: always right.
    quality: dict[str, QualityProfile] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["prices"] = {model: price._asdict() for model, price in self.prices.items()}
        out["quality"] = {model: profile._asdict() for model, profile in self.quality.items()}
        return out

    def fault_rates(self) -> FaultRates:
        return FaultRates(self.seed, self.fail_429_rate, self.fail_5xx_rate, self.malformed_rate, self.cut_stream_rate)


@dataclass
class HostedSimStats(RequestStats):  # requests: inference requests (chat, completions, embeddings)
    cut_streams: int = 0
    malformed: int = 0
    injected_faults: int = 0
    active_streams: int = 0

    def snapshot(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class HostedState:
    """Everything one hosted simulator app mutates; `reset` returns it to a fresh start."""

    config: HostedSimConfig
    stats: HostedSimStats = field(default_factory=HostedSimStats)
    usage: UsageLedger[UsageRecord] = field(default_factory=UsageLedger)
    prompt_cache: HostedPromptCache = field(default_factory=HostedPromptCache)
    rate_limiter: RateLimiter = field(default_factory=RateLimiter)
    truth: TruthLog = field(default_factory=TruthLog)  # chat response id -> was the answer right
    counter: int = 0  # inference requests seen; drives deterministic fault draws
    # Ids come from system entropy, not the seed: a restarted simulator must not repeat
    # request ids a gateway ledger has already stored.
    ids: random.Random = field(default_factory=random.Random)

    def new_hex(self, nbytes: int = 12) -> str:
        return self.ids.randbytes(nbytes).hex()

    def next_counter(self) -> int:
        self.counter += 1
        return self.counter

    def provider_tokens(self, tiktoken_tokens: int) -> int:
        """How many tokens this provider counts for text tiktoken counts this many of."""
        factor = self.config.tokens_per_tiktoken
        return tiktoken_tokens if factor == 1.0 else math.ceil(tiktoken_tokens * factor)

    def record_usage(
        self, kind: str, model: str, key_id: str, request_id: str, input_tokens: int, cached: int, output: int
    ) -> None:
        self.usage.add(UsageRecord(time.time(), kind, model, key_id, request_id, input_tokens, cached, output))

    def reset(self) -> None:
        active = self.stats.active_streams  # streams still open will decrement it later
        self.stats = HostedSimStats(active_streams=active)
        self.usage.clear()
        self.prompt_cache.clear()
        self.rate_limiter.reset()
        self.truth.clear()
        self.counter = 0
