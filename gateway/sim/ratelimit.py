"""The hosted simulator's own RPM/TPM limits and OpenAI's rate-limit headers.

Limits are per model (as OpenAI's are), modelled as token buckets that refill
continuously over a minute. Like OpenAI, the token cost of a request is its prompt
plus its completion bound, taken before anything is generated.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_NS = {"h": 3_600_000_000_000, "m": 60_000_000_000, "s": 1_000_000_000}


def format_go_duration(seconds: float) -> str:
    """Go's time.Duration.String(), as OpenAI's reset headers use: 12ms, 1s, 6m0s, 1h2m3.5s."""
    ns = max(0, round(seconds * 1e9))
    if ns >= 1_000_000:
        ns = round(ns / 1_000_000) * 1_000_000  # millisecond precision hides float noise
    if ns == 0:
        return "0s"
    if ns < 1_000:
        return f"{ns}ns"
    if ns < 1_000_000:
        return _trim(ns / 1_000) + "µs"
    if ns < _NS["s"]:
        return _trim(ns / 1_000_000) + "ms"
    hours, rest = divmod(ns, _NS["h"])
    minutes, rest = divmod(rest, _NS["m"])
    secs = _trim(rest / _NS["s"]) + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    if minutes:
        return f"{minutes}m{secs}"
    return secs


def _trim(value: float) -> str:
    return f"{value:.9f}".rstrip("0").rstrip(".")


@dataclass
class TokenBucket:
    limit: int
    level: float
    updated: float

    @property
    def per_second(self) -> float:
        return self.limit / 60.0

    def refill(self, now: float) -> None:
        self.level = min(float(self.limit), self.level + (now - self.updated) * self.per_second)
        self.updated = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` is available (after `refill`); 0 if it is now."""
        missing = min(amount, float(self.limit)) - self.level
        return max(0.0, missing / self.per_second) if self.per_second > 0 else math.inf

    def reset_in(self) -> float:
        return (self.limit - self.level) / self.per_second if self.per_second > 0 else 0.0


@dataclass(frozen=True)
class RateDecision:
    headers: list[tuple[bytes, bytes]]
    exceeded: str | None = None  # "requests" or "tokens" (OpenAI's error `type`)
    retry_after_s: float = 0.0
    message: str = ""


@dataclass
class RateLimiter:
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[tuple[str, str], TokenBucket] = field(default_factory=dict)

    def reset(self) -> None:
        self._buckets.clear()

    def _bucket(self, model: str, kind: str, limit: int, now: float) -> TokenBucket:
        bucket = self._buckets.get((model, kind))
        if bucket is None or bucket.limit != limit:  # a runtime config change starts afresh
            bucket = self._buckets[(model, kind)] = TokenBucket(limit, float(limit), now)
        bucket.refill(now)
        return bucket

    def check(self, model: str, rpm: int | None, tpm: int | None, tokens: int) -> RateDecision:
        """Take one request and `tokens` tokens, or say which limit is exceeded."""
        if rpm is None and tpm is None:
            return RateDecision([])
        now = self.clock()
        buckets = {}
        if rpm is not None:
            buckets["requests"] = (self._bucket(model, "requests", rpm, now), 1)
        if tpm is not None:
            buckets["tokens"] = (self._bucket(model, "tokens", tpm, now), tokens)
        for kind, (bucket, amount) in buckets.items():
            wait = bucket.wait_for(amount)
            if wait > 0:
                used = bucket.limit - math.floor(bucket.level)
                message = (
                    f"Rate limit reached for {model} in organization org-sim on {kind} per min "
                    f"({'RPM' if kind == 'requests' else 'TPM'}): Limit {bucket.limit}, Used {used}, "
                    f"Requested {amount}. Please try again in {format_go_duration(wait)}."
                )
                return RateDecision(_headers(buckets), kind, wait, message)
        for bucket, amount in buckets.values():
            bucket.level -= amount
        return RateDecision(_headers(buckets))


def _headers(buckets: dict[str, tuple[TokenBucket, int]]) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    for kind, (bucket, _) in buckets.items():
        out.append((f"x-ratelimit-limit-{kind}".encode(), str(bucket.limit).encode()))
        out.append((f"x-ratelimit-remaining-{kind}".encode(), str(max(0, math.floor(bucket.level))).encode()))
        out.append((f"x-ratelimit-reset-{kind}".encode(), format_go_duration(bucket.reset_in()).encode()))
    return out


def retry_after_headers(seconds: float) -> list[tuple[bytes, bytes]]:
    """`retry-after` in whole seconds (rounded up, at least 1) plus the exact `retry-after-ms`."""
    return [
        (b"retry-after", str(max(1, math.ceil(seconds))).encode()),
        (b"retry-after-ms", str(max(1, math.ceil(seconds * 1000))).encode()),
    ]
