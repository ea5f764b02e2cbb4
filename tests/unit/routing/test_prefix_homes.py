"""Homes for prefixes: spread by traffic, not by hash luck, and the same on every
gateway replica that saw about the same traffic."""

from __future__ import annotations

import random

from gateway.routing.prefix_homes import Prefix, PrefixHomes, assign_homes

REPLICAS = [f"http://r{i}:8000/v1" for i in range(4)]
ROOMY = dict.fromkeys(REPLICAS, 100_000)  # KV room for any number of prefixes


def homes_for(weights: dict[bytes, float], replicas: list[str] = REPLICAS, share_factor: float = 1.2,
              blocks: float = 40.0, kv_blocks: int = 100_000) -> dict[bytes, str]:
    return assign_homes({k: Prefix(w, blocks) for k, w in weights.items()}, dict.fromkeys(replicas, kv_blocks), share_factor)


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
        homes = homes_for(weights)
        counts = [list(homes.values()).count(r) for r in REPLICAS]
        assert max(counts) <= 6, (seed, counts)


def test_skewed_traffic_keeps_every_replica_near_its_share() -> None:
    rng = random.Random(3)
    weights = {rng.randbytes(8): 100.0 / (rank + 1) ** 0.8 for rank in range(20)}
    homes = homes_for(weights)
    assert max(shares(homes, weights).values()) <= 0.30 + 1e-9


def test_gateways_that_saw_slightly_different_rates_mostly_agree() -> None:
    rng = random.Random(5)
    keys = [rng.randbytes(8) for _ in range(20)]
    base = {k: 100.0 / (i + 1) ** 0.6 for i, k in enumerate(keys)}
    one = homes_for({k: w * rng.uniform(0.85, 1.15) for k, w in base.items()})
    two = homes_for({k: w * rng.uniform(0.85, 1.15) for k, w in base.items()})
    agree = sum(w for k, w in base.items() if one[k] == two[k]) / sum(base.values())
    assert agree >= 0.8


def test_a_replica_leaving_moves_only_its_own_prefixes_when_there_is_room() -> None:
    keys = [bytes([i]) * 8 for i in range(12)]
    weights = dict.fromkeys(keys, 1.0)
    before = homes_for(weights, share_factor=4.0)
    after = homes_for(weights, REPLICAS[1:], share_factor=4.0)
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == REPLICAS[0] for k in moved)


def test_a_replica_gets_no_more_prefixes_than_its_kv_cache_keeps() -> None:
    # 20 equal tenants of 40 blocks on replicas of 360 blocks: 60 % of 360 is room for 5
    # prefixes each, fewer than the traffic bound alone would allow.
    weights = {bytes([i]) * 8: 1.0 for i in range(20)}
    homes = homes_for(weights, share_factor=2.0, kv_blocks=360)
    assert sorted(list(homes.values()).count(r) for r in REPLICAS) == [5, 5, 5, 5]


def test_until_the_rates_mean_something_homes_depend_only_on_which_prefixes_were_seen() -> None:
    keys = [bytes([i]) * 8 for i in range(8)]
    one, two = PrefixHomes(), PrefixHomes()
    for n, key in enumerate(keys):  # the same prefixes, seen in other orders and numbers
        for _ in range(1 + n % 3):
            one.observe(key, 40, 0.0)
        two.observe(keys[-1 - n], 40, 0.0)
    one.rebalance(ROOMY, 1.0, 1.3)
    two.rebalance(ROOMY, 1.0, 1.3)
    assert dict(one.homes()) == dict(two.homes())
    assert max(list(one.homes().values()).count(r) for r in REPLICAS) == 2, "8 prefixes, 2 to a replica"


def test_quiet_prefixes_are_forgotten() -> None:
    homes = PrefixHomes(half_life_s=100.0)
    homes.observe(b"once", 40, 0.0)
    for t in range(60):
        homes.observe(b"busy", 40, float(t))
    homes.rebalance(ROOMY, 60.0, 1.3)
    assert homes.home(b"busy") in REPLICAS and homes.home(b"once") in REPLICAS
    homes.rebalance(ROOMY, 2000.0, 1.3)
    assert homes.home(b"once") is None


def test_two_gateways_each_routing_half_the_traffic_agree_on_nearly_all_of_it() -> None:
    rng = random.Random(9)
    keys = [rng.randbytes(8) for _ in range(20)]
    weights = [1 / (i + 1) ** 0.6 for i in range(20)]
    gateways = [PrefixHomes(), PrefixHomes()]
    now, disagree, counted = 0.0, 0, 0
    next_rebalance = [0.3, 0.8]
    while now < 180:
        now += rng.expovariate(27)
        key = rng.choices(keys, weights)[0]
        gateways[rng.randrange(2)].observe(key, 40, now)
        for i, gateway in enumerate(gateways):
            if now >= next_rebalance[i]:
                gateway.rebalance(dict.fromkeys(REPLICAS, 360), now, 1.3)
                next_rebalance[i] += 1.0
        if now > 60:
            counted += 1
            disagree += gateways[0].home(key) != gateways[1].home(key)
    assert disagree / counted < 0.10


def test_prefixes_that_fit_nowhere_stay_put_as_the_rates_wobble() -> None:
    # 20 tenants of 40 blocks on replicas of 290: room for 4 prefixes each, so four must
    # overflow somewhere. Where they overflow should not follow the noise in the rates:
    # each move is a cold prefill, and gateways that disagree for a moment split a tenant.
    rng = random.Random(9)
    keys = [rng.randbytes(8) for _ in range(20)]
    base = {k: 100.0 / (i + 1) ** 0.8 for i, k in enumerate(keys)}
    size = {k: rng.uniform(38.0, 44.0) for k in keys}  # system prompt plus a user turn of varying length
    kv = dict.fromkeys(REPLICAS, 290)
    homes = assign_homes({k: Prefix(w, size[k]) for k, w in base.items()}, kv, 1.3)
    moves = 0
    for _ in range(30):
        wobbled = {k: Prefix(w * rng.uniform(0.9, 1.1), size[k] * rng.uniform(0.97, 1.03)) for k, w in base.items()}
        again = assign_homes(wobbled, kv, 1.3, homes)
        moves += sum(again[k] != homes[k] for k in keys)
        homes = again
    assert moves <= 3, f"{moves} prefixes moved over 30 rebalances of unchanged traffic"
