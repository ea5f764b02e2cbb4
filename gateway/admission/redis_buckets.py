"""Token buckets shared by every replica, kept in Redis and changed only by Lua scripts.

Each bucket is a hash {tokens, since} under `<prefix>:{<scope>}:bucket:<name>`; the
scope is the hash tag, so all buckets of one scope sit in one slot and one script can
refill, check and deduct them atomically (on a single Redis, Redis Cluster or Valkey).
Time comes from the Redis server's TIME, so replicas with skewed clocks agree. A key
that is full is deleted (absent means full) and every key expires after twice its
full-refill time, so idle tenants cost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import groupby

import redis.asyncio as redis

from gateway.admission.buckets import TakeResult, merge_takes, seconds_to_full
from gateway.types.limits import BucketSpec

# Buckets that refill slower than this (only test set-ups) are forgiven after a day.
_MAX_TTL_MS = 86_400_000

_PRELUDE = """
local function now_s()
  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function fmt(x) return string.format('%.17g', x) end

-- Level at `now`; a clock stepping backwards never creates tokens (mirrors buckets.refilled).
local function load(key, cap, rate, now)
  local state = redis.call('HMGET', key, 'tokens', 'since')
  if not state[1] then return cap, now end
  local tokens, since = tonumber(state[1]), tonumber(state[2])
  local elapsed = now - since
  if elapsed < 0 then elapsed = 0 end
  return math.min(cap, tokens + elapsed * rate), math.max(since, now)
end

local function store(key, cap, rate, tokens, since)
  if tokens >= cap then
    redis.call('DEL', key)
    return
  end
  redis.call('HSET', key, 'tokens', fmt(tokens), 'since', fmt(since))
  local ttl = MAX_TTL_MS
  if rate > 0 then
    ttl = math.min(MAX_TTL_MS, math.ceil(2000 * math.max(cap, cap - tokens) / rate))
  end
  redis.call('PEXPIRE', key, math.max(1000, ttl))
end

local function wait_for(tokens, amount, cap, rate)
  if tokens >= amount then return 0 end
  if amount > cap or rate <= 0 then return math.huge end
  return (amount - tokens) / rate
end

local function to_full(tokens, cap, rate)
  if tokens >= cap then return 0 end
  if rate <= 0 then return math.huge end
  return (cap - tokens) / rate
end
""".replace("MAX_TTL_MS", str(_MAX_TTL_MS))

# ARGV: now|'', 'take'|'check', then (capacity, refill_per_s, amount) per key.
# Returns granted (1/0), wait_s, then (remaining, reset_s) per key.
_TAKE = _PRELUDE + """
local now = now_s()
local caps, rates, amounts, levels, sinces = {}, {}, {}, {}, {}
local wait = 0
for i = 1, #KEYS do
  local base = 3 * i
  caps[i], rates[i], amounts[i] = tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  levels[i], sinces[i] = load(KEYS[i], caps[i], rates[i], now)
  wait = math.max(wait, wait_for(levels[i], amounts[i], caps[i], rates[i]))
end
if wait == 0 and ARGV[2] == 'take' then
  for i = 1, #KEYS do
    levels[i] = levels[i] - amounts[i]
    store(KEYS[i], caps[i], rates[i], levels[i], sinces[i])
  end
end
local out = {wait == 0 and 1 or 0, fmt(wait)}
for i = 1, #KEYS do
  out[#out + 1] = fmt(levels[i])
  out[#out + 1] = fmt(to_full(levels[i], caps[i], rates[i]))
end
return out
"""

# ARGV: now|'', then (capacity, refill_per_s, delta) per key. Refunds cap at capacity.
_ADJUST = _PRELUDE + """
local now = now_s()
for i = 1, #KEYS do
  local base = 3 * i - 1
  local cap, rate, delta = tonumber(ARGV[base]), tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local tokens, since = load(KEYS[i], cap, rate, now)
  store(KEYS[i], cap, rate, math.min(cap, tokens + delta), since)
end
return 1
"""

# ARGV: now|'', capacity, refill_per_s. Returns (remaining, reset_s).
_PEEK = _PRELUDE + """
local now = now_s()
local cap, rate = tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens = load(KEYS[1], cap, rate, now)
return {fmt(tokens), fmt(to_full(tokens, cap, rate))}
"""

Takes = list[tuple[BucketSpec, float]]


class RedisBuckets:
    """`Buckets` over Redis: one EVALSHA per scope per take().

    Takes spanning several scopes (tenant + model) run one script per scope, in sorted
    scope order; if a later scope refuses, the earlier scopes' deductions are refunded.
    We chose this over one script across all the keys because that only works on a
    single Redis (Cluster rejects cross-slot scripts), and the design keeps one code
    path for both. The price, documented and tested: between a deduction and its
    refund (one round trip) the earlier scope is over-counted, so a concurrent request
    may be refused that would have fit - never admitted beyond a limit. A refund also
    keeps the refill that a full bucket would have discarded during that window, at
    most refill_per_s x one round trip (0.01 requests at 600 rpm and 1 ms).
    """

    unreachable: tuple[type[Exception], ...] = (redis.RedisError,)

    def __init__(self, client: redis.Redis, prefix: str = "gw") -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"the key prefix must not contain braces (they are the hash tag): {prefix!r}")
        self._prefix = prefix
        self._take = client.register_script(_TAKE)
        self._adjust = client.register_script(_ADJUST)
        self._peek = client.register_script(_PEEK)

    def redis_key(self, spec: BucketSpec) -> str:
        """`gw:{tenant:acme}:bucket:rpm` for key "tenant:acme:rpm" in scope "tenant:acme"."""
        name = spec.key.removeprefix(f"{spec.scope}:")
        return f"{self._prefix}:{{{spec.scope}}}:bucket:{name}"

    async def take(self, takes: Sequence[tuple[BucketSpec, float]], now: float | None = None) -> TakeResult:
        """`now`, if given, replaces the server's TIME (seconds since the epoch) - tests only."""
        merged = merge_takes(takes)
        groups = [list(group) for _, group in groupby(sorted(merged, key=lambda t: t[0].scope), key=lambda t: t[0].scope)]
        remaining: dict[str, float] = {}
        reset: dict[str, float] = {}
        taken: list[Takes] = []
        try:
            for index, group in enumerate(groups):
                granted, wait, levels = await self._run_take(group, now, deduct=True)
                self._record(group, levels, remaining, reset)
                if granted:
                    taken.append(group)
                    continue
                refund, taken = taken, []  # cleared first: a failing refund is not retried below
                await self._refund(refund, now, remaining, reset)
                for later in groups[index + 1 :]:
                    _, later_wait, later_levels = await self._run_take(later, now, deduct=False)
                    wait = max(wait, later_wait)
                    self._record(later, later_levels, remaining, reset)
                return TakeResult(granted=False, wait_s=wait, remaining=remaining, reset_s=reset)
        except BaseException:
            # Redis failed (or we were cancelled) mid-way: give back what was deducted so
            # the failure does not silently cost the tenant capacity.
            await self._refund(taken, now, remaining, reset)
            raise
        return TakeResult(granted=True, wait_s=0.0, remaining=remaining, reset_s=reset)

    async def adjust(self, spec: BucketSpec, delta: float) -> None:
        await self._adjust_many([(spec, delta)], None)

    async def peek(self, spec: BucketSpec) -> tuple[float, float]:
        raw = await self._peek(keys=[self.redis_key(spec)], args=["", repr(spec.capacity), repr(spec.refill_per_s)])
        return float(raw[0]), float(raw[1])

    async def _run_take(self, group: Takes, now: float | None, *, deduct: bool) -> tuple[bool, float, list[tuple[float, float]]]:
        args: list[str] = [_now_arg(now), "take" if deduct else "check"]
        for spec, amount in group:
            args += [repr(spec.capacity), repr(spec.refill_per_s), repr(float(amount))]
        raw = await self._take(keys=[self.redis_key(spec) for spec, _ in group], args=args)
        levels = [(float(raw[i]), float(raw[i + 1])) for i in range(2, len(raw), 2)]
        return int(raw[0]) == 1, float(raw[1]), levels

    async def _adjust_many(self, deltas: Takes, now: float | None) -> None:
        """All `deltas` must share one scope (one script call, one slot)."""
        args: list[str] = [_now_arg(now)]
        for spec, delta in deltas:
            args += [repr(spec.capacity), repr(spec.refill_per_s), repr(float(delta))]
        await self._adjust(keys=[self.redis_key(spec) for spec, _ in deltas], args=args)

    async def _refund(self, taken: list[Takes], now: float | None, remaining: dict[str, float], reset: dict[str, float]) -> None:
        for group in taken:
            await self._adjust_many(group, now)
            for spec, amount in group:
                # Report the level as if the take had not happened (what the refund restored).
                remaining[spec.key] = min(spec.capacity, remaining[spec.key] + amount)
                reset[spec.key] = seconds_to_full(remaining[spec.key], spec)

    @staticmethod
    def _record(group: Takes, levels: list[tuple[float, float]], remaining: dict[str, float], reset: dict[str, float]) -> None:
        for (spec, _), (level, to_full) in zip(group, levels, strict=True):
            remaining[spec.key] = level
            reset[spec.key] = to_full


def _now_arg(now: float | None) -> str:
    if now is not None and not math.isfinite(now):
        raise ValueError(f"now must be finite, got {now}")
    return "" if now is None else repr(float(now))
