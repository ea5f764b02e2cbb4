"""What we know about each upstream's state: consecutive failures, cooldowns (shared
across replicas through Redis when configured), and limits learned from its headers,
so the gateway slows down before a provider has to say 429."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.upstreams.ratelimit_headers import ProviderLimits, may_be_exhausted, parse_provider_limits

if TYPE_CHECKING:  # imported only where Redis is configured: it costs start-up time otherwise
    from redis.asyncio import Redis

log = logging.getLogger("gateway.upstreams")
REDIS_RECHECK_S = 0.5


@dataclass(slots=True)
class _State:
    failures: int = 0
    cooling_until: float = 0.0  # monotonic
    paused_until: float = 0.0  # monotonic: a learned limit is exhausted until then
    redis_checked: float = 0.0


class UpstreamHealth:
    def __init__(self, redis: Redis | None = None, prefix: str = "gw") -> None:
        self._redis = redis
        self._redis_errors: tuple[type[Exception], ...] = _redis_errors() if redis is not None else ()
        self._prefix = prefix
        self._states: dict[str, _State] = {}

    def _state(self, upstream: str) -> _State:
        state = self._states.get(upstream)
        if state is None:
            state = self._states[upstream] = _State()
        return state

    def _key(self, upstream: str) -> str:
        return f"{self._prefix}:{{upstream:{upstream}}}:cooldown"

    async def cooldown_left(self, upstream: str) -> float:
        state = self._state(upstream)
        now = time.monotonic()
        if self._redis is not None and now - state.redis_checked > REDIS_RECHECK_S:
            state.redis_checked = now
            try:
                ttl_ms = await self._redis.pttl(self._key(upstream))
            except self._redis_errors as exc:  # a dead Redis must not stop traffic: fall back to local state
                log.warning("cooldown check failed for %s: %s", upstream, exc)
                ttl_ms = -2
            if ttl_ms > 0:
                state.cooling_until = max(state.cooling_until, now + ttl_ms / 1000)
        return max(0.0, state.cooling_until - now)

    def pause_left(self, upstream: str) -> float:
        return max(0.0, self._state(upstream).paused_until - time.monotonic())

    def record_success(self, upstream: str, headers: Mapping[str, str] | None = None) -> None:
        state = self._state(upstream)
        state.failures = 0
        if headers and may_be_exhausted(headers):
            self.learn(upstream, parse_provider_limits(headers))

    def learn(self, upstream: str, limits: ProviderLimits) -> None:
        """Pause sending to an upstream whose own limit says nothing is left - until the
        next unit is back, not until the whole limit is: OpenAI's reset is the time to
        refill completely (a minute for an empty per-minute bucket), while one more
        request fits after reset / limit."""
        waits = []
        for remaining, limit, reset in ((limits.requests_remaining, limits.requests_limit, limits.requests_reset_s),
                                        (limits.tokens_remaining, limits.tokens_limit, limits.tokens_reset_s)):
            if remaining is not None and remaining <= 0 and reset is not None:
                waits.append(reset / limit if limit else reset)
        if waits:
            state = self._state(upstream)
            state.paused_until = max(state.paused_until, time.monotonic() + max(waits))

    async def record_failure(self, upstream: str, cooldown_after: int, cooldown_s: float) -> bool:
        """Count a failure; returns True when it started a cooldown."""
        state = self._state(upstream)
        state.failures += 1
        if state.failures < cooldown_after or cooldown_s <= 0:
            return False
        state.failures = 0
        state.cooling_until = time.monotonic() + cooldown_s
        log.warning("upstream %s cooling down for %.1fs after repeated failures", upstream, cooldown_s)
        if self._redis is not None:
            try:
                await self._redis.set(self._key(upstream), b"1", px=int(cooldown_s * 1000))
            except self._redis_errors as exc:
                log.warning("could not share the cooldown of %s: %s", upstream, exc)
        return True


def _redis_errors() -> tuple[type[Exception], ...]:
    from redis.exceptions import RedisError

    return (RedisError,)
