"""Config, counters, limits and billing records of the Anthropic Messages simulator."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

from gateway.sim.anthropic_cache import AnthropicPromptCache
from gateway.sim.asgi import RequestStats
from gateway.sim.ratelimit import TokenBucket
from gateway.sim.usage_report import UsageLedger

# API versions are dates; the first is 2023-01-01 and every SDK release names a later one.
VERSION = re.compile(r"^20[2-9][0-9]-[01][0-9]-[0-3][0-9]$")


def valid_version(version: str) -> bool:
    return bool(VERSION.match(version)) and version >= "2023-01-01"


class ClaudePrice(NamedTuple):
    """USD per 1M tokens: base input, 5-minute and 1-hour cache writes, cache reads, output."""

    input: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal
    cache_read: Decimal
    output: Decimal


def _price(input_usd: str, output_usd: str) -> ClaudePrice:
    base = Decimal(input_usd)
    return ClaudePrice(base, base * Decimal("1.25"), base * 2, base / 10, Decimal(output_usd))


def default_prices() -> dict[str, ClaudePrice]:
    return {
        "claude-haiku-4-5": _price("1.00", "5.00"),
        "claude-3-5-haiku-20241022": _price("0.80", "4.00"),
        "claude-sonnet-4-20250514": _price("3.00", "15.00"),
        "claude-sim": _price("1.00", "5.00"),
    }


def _default_models() -> list[str]:
    return list(default_prices())


@dataclass
class AnthropicSimConfig:
    models: list[str] = field(default_factory=_default_models)
    seed: int = 0
    output_tokens: int = 20  # answer length when max_tokens allows it
    token_delay_s: float = 0.0
    latency_s: float = 0.0
    rpm: int = 4000  # requests per minute per model; always reported, as Anthropic does
    input_tpm: int = 2_000_000  # input tokens per minute (cache reads do not count)
    output_tpm: int = 400_000  # output tokens per minute (max_tokens taken up front)
    fail_429_rate: float = 0.0
    fail_529_rate: float = 0.0
    retry_after_s: float = 1.0
    spend_limited: bool = False  # every call 429s without retry-after: the org ran out of credit
    # None: any non-empty x-api-key is valid; else only these keys (401 for others).
    api_keys: list[str] | None = None
    admin_key_prefix: str = "sk-ant-admin"
    min_cache_tokens: int = 1024
    prices: dict[str, ClaudePrice] = field(default_factory=default_prices)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["prices"] = {m: {k: str(v) for k, v in p._asdict().items()} for m, p in self.prices.items()}
        return out


@dataclass
class AnthropicSimStats(RequestStats):
    injected_faults: int = 0
    active_streams: int = 0
    last_version: str | None = None
    last_beta: str | None = None

    def snapshot(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class MessagesUsage:
    """One billed call, as the usage and cost reports see it."""

    timestamp: float
    model: str
    api_key_id: str
    request_id: str
    uncached_input: int
    cache_read: int
    cache_write_5m: int
    cache_write_1h: int
    output: int


def api_key_id(key: str) -> str:
    """A stable, non-secret id for an x-api-key, shaped like Anthropic's `apikey_...`."""
    return "apikey_" + hashlib.sha256(key.encode()).hexdigest()[:24]


def _reset_at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass
class AnthropicLimits:
    """Per-model buckets; `check` takes the call or says which limit it would break."""

    clock: Callable[[], float] = time.monotonic
    _buckets: dict[tuple[str, str], TokenBucket] = field(default_factory=dict)

    def _bucket(self, model: str, kind: str, limit: int, now: float) -> TokenBucket:
        bucket = self._buckets.get((model, kind))
        if bucket is None or bucket.limit != limit:
            bucket = self._buckets[(model, kind)] = TokenBucket(limit, float(limit), now)
        bucket.refill(now)
        return bucket

    def check(self, config: AnthropicSimConfig, model: str, input_tokens: int, max_tokens: int) -> tuple[list[tuple[bytes, bytes]], str | None, float]:
        now = self.clock()
        wanted = {
            "requests": (self._bucket(model, "requests", config.rpm, now), 1),
            "input-tokens": (self._bucket(model, "input-tokens", config.input_tpm, now), input_tokens),
            "output-tokens": (self._bucket(model, "output-tokens", config.output_tpm, now), max_tokens),
        }
        exceeded, wait = None, 0.0
        for kind, (bucket, amount) in wanted.items():
            need = bucket.wait_for(amount)
            if need > 0 and exceeded is None:
                exceeded, wait = kind, need
        if exceeded is None:
            for bucket, amount in wanted.values():
                bucket.level -= amount
        headers: list[tuple[bytes, bytes]] = []
        for kind, (bucket, _) in wanted.items():
            headers += [
                (f"anthropic-ratelimit-{kind}-limit".encode(), str(bucket.limit).encode()),
                (f"anthropic-ratelimit-{kind}-remaining".encode(), str(max(0, math.floor(bucket.level))).encode()),
                (f"anthropic-ratelimit-{kind}-reset".encode(), _reset_at(bucket.reset_in()).encode()),
            ]
        tokens_left = min(wanted["input-tokens"][0].level, wanted["output-tokens"][0].level)
        headers += [
            (b"anthropic-ratelimit-tokens-limit", str(min(config.input_tpm, config.output_tpm)).encode()),
            (b"anthropic-ratelimit-tokens-remaining", str(max(0, math.floor(tokens_left))).encode()),
            (b"anthropic-ratelimit-tokens-reset", _reset_at(0).encode()),
        ]
        return headers, exceeded, wait

    def reset(self) -> None:
        self._buckets.clear()


@dataclass
class AnthropicState:
    config: AnthropicSimConfig
    stats: AnthropicSimStats = field(default_factory=AnthropicSimStats)
    cache: AnthropicPromptCache = field(default_factory=AnthropicPromptCache)
    limits: AnthropicLimits = field(default_factory=AnthropicLimits)
    usage: UsageLedger[MessagesUsage] = field(default_factory=UsageLedger)
    counter: int = 0
    ids: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self.cache.min_tokens = self.config.min_cache_tokens

    def new_id(self, prefix: str, nbytes: int = 12) -> str:
        return prefix + self.ids.randbytes(nbytes).hex()

    def next_counter(self) -> int:
        self.counter += 1
        return self.counter

    def reset(self) -> None:
        self.stats = AnthropicSimStats(active_streams=self.stats.active_streams)
        self.cache.clear()
        self.cache.min_tokens = self.config.min_cache_tokens
        self.limits.reset()
        self.usage.clear()
        self.counter = 0
