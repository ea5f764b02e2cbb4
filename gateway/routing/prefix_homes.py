"""A home replica for each busy prefix, so that the pool's prefixes are spread in
proportion to their traffic and every gateway replica places them alike.

Plain rendezvous hashing gives each prefix a stable first choice, but 20 tenants hashed
onto 4 replicas put 8 or more on one replica about a third of the time: 40 % of the
requests, and more prefixes than its KV cache holds. So homes are assigned with
bounded loads (consistent hashing with bounded loads, Mirrokni et al., weighted): the
prefixes, heaviest class first (powers of two of their recent request rate, then by key,
so two gateways that saw slightly different rates still agree), each go to the first
replica in their rendezvous order whose assigned traffic stays within `share_factor` x
the average, else to the least assigned. Each gateway counts only the requests it
routed; with requests spread over the gateways, every one sees the same prefixes at
about the same rates, and computes the same homes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.routing.replica_choice import rendezvous_order

FORGET_BELOW = 0.05  # a prefix's decayed request count below this is forgotten


def assign_homes(weights: Mapping[bytes, float], replicas: Sequence[str], share_factor: float) -> dict[bytes, str]:
    """key -> home replica; pure."""
    if not replicas:
        return {}
    cap = share_factor * sum(weights.values()) / len(replicas)
    assigned = dict.fromkeys(replicas, 0.0)
    homes: dict[bytes, str] = {}
    for key in sorted(weights, key=lambda k: (-_weight_class(weights[k]), k)):
        weight = weights[key]
        order = rendezvous_order(key, replicas)
        home = next((r for r in order if assigned[r] + weight <= cap), None)
        if home is None:
            home = min(order, key=assigned.__getitem__)  # ties: the earlier in rendezvous order
        assigned[home] += weight
        homes[key] = home
    return homes


def _weight_class(weight: float) -> int:
    return math.frexp(weight)[1] if weight > 0 else -1_000


@dataclass(slots=True)
class _Rate:
    count: float
    at: float


class PrefixHomes:
    """Recent request rates per prefix key (exponentially decayed) and the homes last
    assigned from them."""

    def __init__(self, half_life_s: float = 60.0, max_keys: int = 4096) -> None:
        self.half_life_s = half_life_s
        self.max_keys = max_keys
        self._rates: dict[bytes, _Rate] = {}
        self._homes: dict[bytes, str] = {}

    def observe(self, key: bytes, now: float) -> None:
        rate = self._rates.get(key)
        if rate is None:
            if len(self._rates) >= 2 * self.max_keys:
                self._prune(now)
            self._rates[key] = _Rate(1.0, now)
            return
        rate.count = self._decayed(rate, now) + 1.0
        rate.at = now

    def home(self, key: bytes) -> str | None:
        return self._homes.get(key)

    def rebalance(self, replicas: Sequence[str], now: float, share_factor: float) -> None:
        self._prune(now)
        weights = {key: self._decayed(rate, now) for key, rate in self._rates.items()}
        self._homes = assign_homes(weights, replicas, share_factor)

    def homes(self) -> Mapping[bytes, str]:
        return self._homes

    def _decayed(self, rate: _Rate, now: float) -> float:
        return rate.count * math.exp2(-max(0.0, now - rate.at) / self.half_life_s)

    def _prune(self, now: float) -> None:
        live = {key: rate for key, rate in self._rates.items() if self._decayed(rate, now) >= FORGET_BELOW}
        if len(live) > self.max_keys:
            kept = sorted(live, key=lambda k: self._decayed(live[k], now), reverse=True)[: self.max_keys]
            live = {key: live[key] for key in kept}
        self._rates = live
