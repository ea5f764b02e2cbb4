"""Homes for prefixes: spread by traffic, not by hash luck, and the same on every
gateway replica that saw about the same traffic."""

from __future__ import annotations

import random

from gateway.routing.prefix_homes import PrefixHomes, assign_homes

REPLICAS = [f"http://r{i}:8000/v1" for i in range(4)]


def shares(homes: dict[bytes, str], weights: dict[bytes, float]) -> dict[str, float]:
    total = sum(weights.values())
    out = dict.fromkeys(REPLICAS, 0.0)
    for key, home in homes.items():
        out[home] += weights[key] / total
    return out


def test_twenty_equal_tenants_land_five_or_six_to_a_replica_whatever_the_hashes() -> None:
    for seed in range(50):
        keys = [random.Random(seed).randbytes(8) + bytes([i]) for i in range(20)]
        weights = dict.fromkeys(keys, 10.0)
        homes = assign_homes(weights, REPLICAS, share_factor=1.2)
        counts = [list(homes.values()).count(r) for r in REPLICAS]
        assert max(counts) <= 6, (seed, counts)


def test_skewed_traffic_keeps_every_replica_near_its_share() -> None:
    rng = random.Random(3)
    weights = {rng.randbytes(8): 100.0 / (rank + 1) ** 0.8 for rank in range(20)}
    homes = assign_homes(weights, REPLICAS, share_factor=1.2)
    assert max(shares(homes, weights).values()) <= 0.30 + 1e-9


def test_gateways_that_saw_slightly_different_rates_mostly_agree() -> None:
    rng = random.Random(5)
    keys = [rng.randbytes(8) for _ in range(20)]
    base = {k: 100.0 / (i + 1) ** 0.6 for i, k in enumerate(keys)}
    one = assign_homes({k: w * rng.uniform(0.85, 1.15) for k, w in base.items()}, REPLICAS, 1.2)
    two = assign_homes({k: w * rng.uniform(0.85, 1.15) for k, w in base.items()}, REPLICAS, 1.2)
    agree = sum(w for k, w in base.items() if one[k] == two[k]) / sum(base.values())
    assert agree >= 0.8


def test_a_replica_leaving_moves_only_its_own_prefixes_when_there_is_room() -> None:
    keys = [bytes([i]) * 8 for i in range(12)]
    weights = dict.fromkeys(keys, 1.0)
    before = assign_homes(weights, REPLICAS, share_factor=4.0)
    after = assign_homes(weights, REPLICAS[1:], share_factor=4.0)
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == REPLICAS[0] for k in moved)


def test_rates_decay_and_quiet_prefixes_are_forgotten() -> None:
    homes = PrefixHomes(half_life_s=10.0)
    for t in range(10):
        homes.observe(b"busy", float(t))
    homes.observe(b"once", 0.0)
    homes.rebalance(REPLICAS, 10.0, 1.2)
    assert homes.home(b"busy") in REPLICAS and homes.home(b"once") in REPLICAS
    homes.rebalance(REPLICAS, 200.0, 1.2)
    assert homes.home(b"once") is None
