"""Which replica of a self-hosted pool serves a request, or whether it spills to the
model's hosted fallback: a pure function of (replica views, request) -> choice, fed by
the pool's stats scraper and prefix index (upstreams/pool.py) and tested without HTTP.

The rule, in order:
1. Only replicas that are healthy and not draining are candidates; none left is a
   spill (`unhealthy`) when the model has a fallback.
2. A request whose prompt fills at least one KV block has a prefix key (its first block,
   tenant salt included). Its preferred order is the key's home replica (prefix_homes.py),
   then the others by rendezvous rank of the key - the same order on every gateway
   replica, whatever each alone routed. A key without a home yet prefers the replicas
   by how many of its leading blocks each was sent recently, then by rendezvous rank. A
   prompt too short to cache goes to the least loaded replica.
3. The first replica in that order with room takes it if it would start it at once
   (even cold: a home that moved fills only so); with a queue there, the next one in
   order that would give the first token markedly sooner, its cold prefill included,
   takes it instead. A replica has no room when taking
   the request would queue it there (its load reaches its slots: `max_num_seqs`,
   configured or learned) while the pool on average has room, or when its load passes
   `load_factor` x the pool's average, or its KV use passes `max_kv_usage`. So a hot
   tenant spreads over two replicas rather than queue on one. With no replica that has
   room, the one with the shortest predicted wait takes it.
4. Predicted wait = requests ahead of it beyond the replica's slots x the time a request
   recently held a slot / slots. Longer than the request's time left or the policy's
   `max_queue_wait_s`: another replica that can start it in time, else a spill
   (`saturated`) when the model has a fallback, else it queues on the pool.

Imports nothing from the package."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

SATURATED = "saturated"
SOONER = 0.8  # another replica must start a request this much sooner to be worth leaving the preferred one
UNHEALTHY = "unhealthy"


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica as the router sees it at this moment."""

    url: str
    usable: bool = True  # healthy and not draining
    load: float = 0.0  # requests running or waiting there, from every gateway (estimated)
    slots: int | None = None  # requests it runs at once; None: unknown (never seen it queue)
    slot_time_s: float | None = None  # how long a request recently held a slot
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc
    matched: int = 0  # leading blocks of this request's prompt recently routed there
    prefill_s_per_token: float | None = None  # recent prefill time per uncached prompt token


@dataclass(frozen=True, slots=True)
class ChoiceRequest:
    key: bytes | None  # prefix key (first block hash); None: nothing to cache
    home: str | None = None  # the key's home replica, if it has one
    time_left_s: float = math.inf  # until the request's deadline
    can_spill: bool = False  # the model has a fallback to spill to
    turn: int = 0  # rotates ties among keyless requests
    blocks: int = 0  # full KV blocks in the prompt
    block_tokens: int = 16


@dataclass(frozen=True, slots=True)
class ChoiceSettings:
    load_factor: float = 1.5
    min_load_bound: int = 8  # a replica whose slots are unknown always has room for this many
    max_kv_usage: float = 0.95
    max_queue_wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class Choice:
    replica: str | None  # None: spill
    spill: str | None = None  # SATURATED | UNHEALTHY
    predicted_wait_s: float = 0.0
    detail: str = ""
    reason: str = ""  # home | cached | new | least_loaded | overflow | in_time | spill


def rendezvous_rank(key: bytes, url: str) -> int:
    """Highest random weight: every gateway ranks a key's replicas the same way, and a
    replica leaving moves only the keys it ranked first."""
    return int.from_bytes(hashlib.blake2b(key + url.encode("utf-8"), digest_size=8).digest(), "big")


def rendezvous_order(key: bytes, urls: Sequence[str]) -> list[str]:
    return sorted(urls, key=lambda url: rendezvous_rank(key, url), reverse=True)


def predicted_wait_s(view: ReplicaView) -> float:
    """How long a request sent now would wait for a slot there."""
    if view.slots is None or view.slot_time_s is None:
        return 0.0
    ahead = view.load + 1 - view.slots
    return max(0.0, ahead) * view.slot_time_s / max(1, view.slots)


def choose_replica(views: Sequence[ReplicaView], request: ChoiceRequest, settings: ChoiceSettings) -> Choice:
    usable = [v for v in views if v.usable]
    if not usable:
        return Choice(None, UNHEALTHY, detail="no replica of the pool is healthy")
    order = _preference(usable, request)
    pick = _place(order, request, settings)
    reason = _reason(pick, order, request)
    wait = predicted_wait_s(pick)
    limit = request.time_left_s if settings.max_queue_wait_s is None else min(request.time_left_s, settings.max_queue_wait_s)
    if wait > limit:
        in_time = [v for v in order if predicted_wait_s(v) <= limit]
        if in_time:
            pick, reason = in_time[0], "in_time"
            wait = predicted_wait_s(pick)
        elif request.can_spill:
            shortest = min(predicted_wait_s(v) for v in usable)
            return Choice(None, SATURATED, shortest, f"the pool is saturated: predicted queue wait {shortest:.2f}s > {limit:.2f}s",
                          "spill")
    return Choice(pick.url, None, wait, reason=reason)


def _reason(pick: ReplicaView, order: list[ReplicaView], request: ChoiceRequest) -> str:
    if request.key is None:
        return "least_loaded"
    if pick is not order[0]:
        return "overflow"
    if pick.url == request.home:
        return "home"
    return "cached" if pick.matched else "new"


def _preference(usable: list[ReplicaView], request: ChoiceRequest) -> list[ReplicaView]:
    if request.key is None:
        n = len(usable)
        return sorted(usable, key=lambda v: (v.load, (usable.index(v) - request.turn) % n))
    key = request.key
    if request.home is not None and any(v.url == request.home for v in usable):
        # After the home, the key's rendezvous order alone: every gateway overflows a busy
        # prefix to the same replica, where what one gateway alone sent would differ.
        return sorted(usable, key=lambda v: (v.url != request.home, -rendezvous_rank(key, v.url)))
    return sorted(usable, key=lambda v: (-v.matched, -rendezvous_rank(key, v.url)))


def predicted_ttft_s(view: ReplicaView, request: ChoiceRequest, prefill_s_per_token: float) -> float:
    """Wait for a slot, then prefill what the replica does not hold."""
    uncached = (request.blocks - view.matched) * request.block_tokens
    return predicted_wait_s(view) + max(0, uncached) * prefill_s_per_token


def _place(order: list[ReplicaView], request: ChoiceRequest, settings: ChoiceSettings) -> ReplicaView:
    """The first replica in preference order with room; a later one only when it would
    start the request markedly sooner, its cold prefill included."""
    total = sum(v.load for v in order)
    bound = max(settings.load_factor * (total + 1) / len(order), settings.min_load_bound)
    slots = [v.slots if v.slots is not None else settings.min_load_bound for v in order]
    speeds = [v.prefill_s_per_token for v in order if v.prefill_s_per_token is not None]
    prefill = sum(speeds) / len(speeds) if speeds else None
    # Without a prefill speed to weigh a queue against a cold prefill, queueing on one
    # replica is avoided while the pool, on average, has room.
    avoid_queue = prefill is None and (total + 1) / len(order) < sum(slots) / len(slots)

    def has_room(v: ReplicaView) -> bool:
        if v.kv_usage >= settings.max_kv_usage:
            return False
        if avoid_queue and v.slots is not None and v.load + 1 > v.slots:
            return False
        return v.load + 1 <= bound

    roomy = [v for v in order if has_room(v)]
    if not roomy:
        return min(order, key=predicted_wait_s)
    first = roomy[0]
    if prefill is None:
        return first

    def ttft(v: ReplicaView) -> float:
        return predicted_ttft_s(v, request, v.prefill_s_per_token if v.prefill_s_per_token is not None else prefill)

    if predicted_wait_s(first) <= 0:
        # No queue at the preferred replica: it takes the request, even cold. Leaving it
        # for a replica that this gateway alone saw hold the prefix would keep each
        # gateway on its own past choices, and a moved home would never fill.
        return first
    for v in roomy[1:]:  # in preference order, so that every gateway overflows alike
        if ttft(v) < SOONER * ttft(first):
            return v
    return first
