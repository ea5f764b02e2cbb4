"""A self-hosted pool's live state: its replicas (health, draining, requests in flight,
what their `/metrics` last said), the prefix index and the prefixes' homes. For each
request it asks `routing/replica_choice.py` which replica, or whether to spill.

One `Pool` per vLLM upstream, kept by the registry across policy reloads: an edit that
keeps a replica keeps its index and stats; a replica the edit removes is draining - it
gets no new requests and leaves once its requests in flight have finished. Fed by the
requests themselves (in flight, errors) and by `pool_monitor.py` (health, metrics)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import PoolSpill, UpstreamError
from gateway.routing.policy import PoolSettings
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.routing.prefix_blocks import BYTES_PER_TOKEN, DEFAULT_BLOCK_TOKENS, block_hashes
from gateway.routing.prefix_homes import PrefixHomes
from gateway.routing.prefix_index import PrefixIndex
from gateway.routing.replica_choice import UNHEALTHY, ChoiceRequest, ChoiceSettings, ReplicaView, choose_replica
from gateway.upstreams.base import PoolRequest
from gateway.upstreams.pool_metrics import ReplicaMetrics
from gateway.upstreams.sessions import proxy_for

log = logging.getLogger("gateway.pool")

DEFAULT_KV_BLOCKS = 8192  # until a replica's cache_config_info says
STALE_AFTER_SCRAPES = 5  # metrics older than this many intervals say nothing about load
SMOOTHING = 0.3  # weight of the newest figure in a moving average
TENANT_HALF_LIFE_S = 60.0


@dataclass(slots=True)
class Replica:
    url: str
    proxy: str | None
    in_flight: int = 0  # this gateway's requests on it
    healthy: bool = True
    seen_up: bool = False  # has answered this gateway (a probe or a request) since it started
    draining: bool = False
    errors: int = 0  # consecutive 5xx answers
    ejected_because: str | None = None
    metrics: ReplicaMetrics | None = None
    scraped_at: float = -math.inf  # monotonic
    in_flight_at_scrape: int = 0
    slots: int | None = None  # learned: requests it runs at once
    slot_time_s: float | None = None  # recent mean time a request holds a slot
    hit_rate: float | None = None  # recent prefix-cache hit rate (tokens)
    prefill_s_per_token: float | None = None  # recent prefill time per uncached prompt token
    sent_bytes: int = 0  # prompt bytes this gateway sent it since its last scrape ...
    sent_requests: int = 0  # ... in this many requests
    tenants: dict[str, tuple[float, float]] = field(default_factory=dict)  # tenant -> (decayed count, at)

    @property
    def usable(self) -> bool:
        return self.healthy and not self.draining


class Pool:
    def __init__(self, name: str, config: UpstreamConfig, clock: Any = time.monotonic) -> None:
        self.name = name
        self.replicas: dict[str, Replica] = {}
        self.index = PrefixIndex()
        self.homes = PrefixHomes()
        self.key_tenants: dict[bytes, str] = {}  # prefix key -> the tenant it was last seen for, for the admin view
        self._clock = clock
        self._turn = 0
        self.reasons: dict[str, int] = {}  # why each request went where it went, since start
        # The router's blocks are bytes; the replicas' are tokens. How many bytes make a
        # token is learned from what the replicas count (their prompt tokens per request
        # against the bytes per request sent them), to size prefixes in their KV blocks.
        self.bytes_per_token = float(BYTES_PER_TOKEN)
        self.reconfigure(config)

    def reconfigure(self, config: UpstreamConfig) -> None:
        self.settings: PoolSettings = config.pool_settings()
        s = self.settings
        self.choice = ChoiceSettings(load_factor=s.load_factor, max_kv_usage=s.max_kv_usage, max_queue_wait_s=s.max_queue_wait_s)
        urls = config.urls()
        for url in urls:
            replica = self.replicas.get(url)
            if replica is None:
                self.replicas[url] = Replica(url, proxy_for(url))
            else:
                replica.draining = False
        for replica in list(self.replicas.values()):
            if replica.url not in urls:
                replica.draining = True
                self._leave_if_drained(replica)
        for replica in self.replicas.values():
            self.index.resize(replica.url, self._index_blocks(replica))

    def drain_all(self) -> None:
        """The pool left the policy: no new requests; each replica leaves once idle."""
        for replica in list(self.replicas.values()):
            replica.draining = True
            self._leave_if_drained(replica)

    # -- placing a request ----------------------------------------------------------------

    def block_size(self) -> int:
        if self.settings.block_size is not None:
            return self.settings.block_size
        for replica in self.replicas.values():
            if replica.metrics is not None and replica.metrics.block_size:
                return replica.metrics.block_size
        return DEFAULT_BLOCK_TOKENS

    def choose(self, request: PoolRequest | None) -> Replica:
        """The replica to send to (counted in flight: call `finished` after), or raises
        PoolSpill (to the fallback), or UpstreamError when the pool can serve nothing."""
        now = self._clock()
        data = request.prompt.encode("utf-8") if request is not None else b""
        blocks = block_hashes(data, request.salt, self.block_size()) if request is not None and data else []
        key = blocks[0] if blocks else None
        if key is not None:
            self.homes.observe(key, len(blocks) * BYTES_PER_TOKEN / self.bytes_per_token, now)
            self._note_tenant(key, request)
        self._turn += 1
        views = [self._view(r, blocks, now) for r in self.replicas.values()]
        ask = ChoiceRequest(key=key, home=self.homes.home(key) if key is not None else None,
                            time_left_s=request.deadline - now if request is not None else math.inf,
                            can_spill=request is not None and request.can_spill, turn=self._turn,
                            blocks=len(blocks), block_tokens=self.block_size())
        replica = self.replicas[self._decide(views, ask)]
        if blocks:
            self.index.record(replica.url, blocks)
        replica.sent_bytes += len(data)
        replica.sent_requests += 1
        if request is not None:
            self._count_tenant(replica, request.tenant, now)
        replica.in_flight += 1
        return replica

    def _decide(self, views: list[ReplicaView], ask: ChoiceRequest) -> str:
        choice = choose_replica(views, ask, self.choice)
        if choice.replica is None:
            reason = choice.spill or UNHEALTHY
            if ask.can_spill:
                self.reasons[reason] = self.reasons.get(reason, 0) + 1
                raise PoolSpill(reason, choice.detail)
            # Nowhere else to go: rather than refuse, try the replicas that were taken out
            # (as Envoy's panic mode does); one may be back before its probe says so.
            views = [ReplicaView(v.url, usable=not self.replicas[v.url].draining, load=v.load, matched=v.matched) for v in views]
            choice = choose_replica(views, ask, self.choice)
            if choice.replica is None:
                raise UpstreamError(f"upstream `{self.name}` has no replica left to try")
        self.reasons[choice.reason] = self.reasons.get(choice.reason, 0) + 1
        return choice.replica

    def _view(self, replica: Replica, blocks: list[bytes], now: float) -> ReplicaView:
        load = float(replica.in_flight)
        kv = 0.0
        m = replica.metrics
        if m is not None and now - replica.scraped_at <= STALE_AFTER_SCRAPES * self.settings.scrape_interval_s:
            # Others' requests there: what it last reported, less ours in flight then.
            load += max(0.0, m.running + m.waiting - replica.in_flight_at_scrape)
            kv = m.kv_usage
        return ReplicaView(url=replica.url, usable=replica.usable, load=load, slots=self.settings.max_num_seqs or replica.slots,
                           slot_time_s=replica.slot_time_s, kv_usage=kv, prefill_s_per_token=replica.prefill_s_per_token,
                           matched=self.index.matched(replica.url, blocks) if blocks else 0)

    def _note_tenant(self, key: bytes, request: PoolRequest | None) -> None:
        if request is None:
            return
        self.key_tenants[key] = request.tenant
        if len(self.key_tenants) > 2 * self.homes.max_keys:
            homed = self.homes.homes()
            self.key_tenants = {k: t for k, t in self.key_tenants.items() if k in homed}

    def _count_tenant(self, replica: Replica, tenant: str, now: float) -> None:
        count, at = replica.tenants.get(tenant, (0.0, now))
        replica.tenants[tenant] = (count * math.exp2(-(now - at) / TENANT_HALF_LIFE_S) + 1.0, now)
        if len(replica.tenants) > 256:
            replica.tenants = dict(sorted(replica.tenants.items(), key=lambda kv: kv[1][0], reverse=True)[:128])

    # -- what the requests report ---------------------------------------------------------

    def finished(self, replica: Replica) -> None:
        replica.in_flight -= 1
        self._leave_if_drained(replica)

    def answered(self, replica: Replica, status: int) -> None:
        replica.seen_up = True
        if status < 500:
            replica.errors = 0
            return
        replica.errors += 1
        if replica.errors >= self.settings.eject_after_errors:
            self.eject(replica, f"{replica.errors} answers in a row with status 5xx (last {status})")

    def unreachable(self, replica: Replica, why: str) -> bool:
        """The replica failed before answering; returns whether another can take over."""
        self.eject(replica, why)
        return any(r.usable for r in self.replicas.values())

    def eject(self, replica: Replica, why: str) -> None:
        if replica.healthy:
            # One that has not answered yet is starting up (the gateway came up first), not failing.
            level = logging.WARNING if replica.seen_up else logging.INFO
            what = "taken out" if replica.seen_up else "not up yet"
            log.log(level, "pool %s: replica %s %s: %s", self.name, replica.url, what, why)
        replica.healthy = False
        replica.ejected_because = why
        replica.errors = 0

    # -- what the monitor reports ---------------------------------------------------------

    def probed(self, replica: Replica, healthy: bool, metrics: ReplicaMetrics | None, why: str = "") -> None:
        now = self._clock()
        if not healthy:
            self.eject(replica, why or "/health did not answer 200")
            return
        if not replica.healthy:
            log.log(logging.WARNING if replica.seen_up else logging.INFO, "pool %s: replica %s is %s", self.name, replica.url,
                    "back" if replica.seen_up else "up")
        replica.healthy = replica.seen_up = True
        replica.ejected_because = None
        if metrics is None:
            return
        self._learn(replica, metrics)
        replica.metrics, replica.scraped_at, replica.in_flight_at_scrape = metrics, now, replica.in_flight
        self.index.resize(replica.url, self._index_blocks(replica))

    def _learn(self, replica: Replica, m: ReplicaMetrics) -> None:
        if m.waiting > 0:
            replica.slots = max(1, round(m.running))  # it queues: this is as many as it runs
        elif replica.slots is not None and m.running > replica.slots:
            replica.slots = round(m.running)
        prev = replica.metrics
        if prev is None:
            return
        if m.prompt_tokens < prev.prompt_tokens or m.e2e_count < prev.e2e_count:
            self.index.forget(replica.url)  # its counters restarted: so did it, with an empty cache
            return
        done = m.e2e_count - prev.e2e_count
        if done > 0 and replica.sent_requests > 0 and m.prompt_tokens > prev.prompt_tokens:
            per_request = (m.prompt_tokens - prev.prompt_tokens) / done
            self.bytes_per_token = _smooth(self.bytes_per_token, replica.sent_bytes / replica.sent_requests / per_request)
            replica.sent_bytes = replica.sent_requests = 0
        if done > 0:
            held = ((m.e2e_sum - prev.e2e_sum) - (m.queue_sum - prev.queue_sum)) / done
            replica.slot_time_s = _smooth(replica.slot_time_s, max(held, 0.0))
        queried = m.prefix_queries - prev.prefix_queries
        hits = m.prefix_hits - prev.prefix_hits
        if queried > 0:
            replica.hit_rate = _smooth(replica.hit_rate, hits / queried)
        uncached = (m.prompt_tokens - prev.prompt_tokens) - hits
        if done > 0 and uncached > 0:
            replica.prefill_s_per_token = _smooth(replica.prefill_s_per_token, (m.prefill_sum - prev.prefill_sum) / uncached)

    def kv_for_homes(self) -> dict[str, int]:
        """The usable replicas, each with its KV capacity in its own blocks."""
        return {r.url: self._kv_blocks(r) for r in self.replicas.values() if r.usable}

    def rebalance(self) -> None:
        self.homes.rebalance(self.kv_for_homes(), self._clock(), self.settings.home_share_factor)

    def _index_blocks(self, replica: Replica) -> int:
        """The replica's KV capacity in the router's blocks (of bytes)."""
        return round(self._kv_blocks(replica) * self.bytes_per_token / BYTES_PER_TOKEN)

    def _kv_blocks(self, replica: Replica) -> int:
        if self.settings.kv_blocks is not None:
            return self.settings.kv_blocks
        if replica.metrics is not None and replica.metrics.num_gpu_blocks:
            return replica.metrics.num_gpu_blocks
        return DEFAULT_KV_BLOCKS

    def _leave_if_drained(self, replica: Replica) -> None:
        if replica.draining and replica.in_flight <= 0 and self.replicas.get(replica.url) is replica:
            del self.replicas[replica.url]
            self.index.drop(replica.url)
            log.info("pool %s: replica %s drained and removed", self.name, replica.url)

    # -- the admin view -------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        now = self._clock()
        homes: dict[str, set[str]] = {}
        for key, url in self.homes.homes().items():
            homes.setdefault(url, set()).add(self.key_tenants.get(key, "?"))
        return {"upstream": self.name, "block_size": self.block_size(), "bytes_per_token": round(self.bytes_per_token, 3),
                "choices": dict(sorted(self.reasons.items())),
                "replicas": [self._replica_snapshot(r, now, homes.get(r.url, set())) for r in self.replicas.values()]}

    def _replica_snapshot(self, r: Replica, now: float, homes: set[str]) -> dict[str, Any]:
        m = r.metrics
        tenants = {t: round(c * math.exp2(-(now - at) / TENANT_HALF_LIFE_S), 2) for t, (c, at) in r.tenants.items()}
        top = dict(sorted(((t, c) for t, c in tenants.items() if c >= 0.05), key=lambda kv: kv[1], reverse=True)[:20])
        return {
            "url": r.url, "healthy": r.healthy, "draining": r.draining, "ejected_because": r.ejected_because,
            "in_flight": r.in_flight, "running": m.running if m else None, "waiting": m.waiting if m else None,
            "kv_cache_usage": m.kv_usage if m else None, "prefix_hit_rate": _round(r.hit_rate),
            "slots": self.settings.max_num_seqs or r.slots, "slot_time_s": _round(r.slot_time_s),
            "prefill_ms_per_1k_tokens": _round(r.prefill_s_per_token * 1e6) if r.prefill_s_per_token is not None else None,
            "metrics_age_s": _round(now - r.scraped_at) if m else None,
            "index_blocks": self.index.size(r.url), "index_capacity": self.index.capacity(r.url),
            "home_tenants": sorted(homes), "recent_tenants": top,
        }


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
