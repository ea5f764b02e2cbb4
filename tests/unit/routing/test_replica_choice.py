"""Replica choice for a self-hosted pool, as a pure function: prefix affinity, the load
bound, health, and when a request spills to the hosted fallback."""

from __future__ import annotations

from gateway.routing.replica_choice import (
    SATURATED,
    UNHEALTHY,
    ChoiceRequest,
    ChoiceSettings,
    ReplicaView,
    choose_replica,
    predicted_wait_s,
    rendezvous_order,
)

URLS = [f"http://r{i}:8000/v1" for i in range(4)]
SETTINGS = ChoiceSettings()


def views(**overrides: dict[str, object]) -> list[ReplicaView]:
    """Four idle replicas; `overrides` by index name (r0..r3) change fields of one."""
    out = []
    for i, url in enumerate(URLS):
        fields: dict[str, object] = {"url": url, **overrides.get(f"r{i}", {})}
        out.append(ReplicaView(**fields))  # type: ignore[arg-type]
    return out


def test_a_prefix_goes_to_the_replica_that_holds_it() -> None:
    choice = choose_replica(views(r2={"matched": 30}), ChoiceRequest(key=b"tenant-a"), SETTINGS)
    assert choice.replica == URLS[2]


def test_a_new_prefix_goes_to_the_same_replica_from_every_gateway() -> None:
    # Nothing matched anywhere: the rendezvous order of the key decides, so two gateway
    # replicas with no shared state agree, and different prefixes spread.
    firsts = {choose_replica(views(), ChoiceRequest(key=f"tenant-{i}".encode()), SETTINGS).replica for i in range(40)}
    assert firsts == set(URLS)
    again = [choose_replica(views(), ChoiceRequest(key=b"tenant-7"), SETTINGS).replica for _ in range(3)]
    assert again == [rendezvous_order(b"tenant-7", URLS)[0]] * 3


def test_the_prefix_home_wins_over_a_stray_match_elsewhere() -> None:
    request = ChoiceRequest(key=b"tenant-a", home=URLS[1])
    assert choose_replica(views(r3={"matched": 30}), request, SETTINGS).replica == URLS[1]


def test_a_full_home_sends_the_hot_tenant_where_every_gateway_sends_it() -> None:
    # r0, its home, runs all 4 of its slots; the pool has room elsewhere, so the request
    # goes to the key's next replica in rendezvous order rather than queue - not to one
    # this gateway alone saw hold the prefix, which the other gateways did not.
    request = ChoiceRequest(key=b"hot", home=URLS[0])
    second = rendezvous_order(b"hot", URLS[1:])[0]
    elsewhere = next(url for url in URLS[1:] if url != second)
    full_home = {"matched": 30, "load": 4, "slots": 4, "slot_time_s": 1.0}
    for seen in ({}, {f"r{URLS.index(elsewhere)}": {"matched": 30, "load": 1, "slots": 4}}):
        choice = choose_replica(views(r0=full_home, **seen), request, SETTINGS)  # type: ignore[arg-type]
        assert choice.replica == second and choice.reason == "overflow"
        assert choice.predicted_wait_s == 0


def test_a_home_without_a_queue_takes_its_prefix_even_cold() -> None:
    # The home moved: the old replica still holds the prefix, the new one not yet. With no
    # queue at the new home it takes the request, so the prefix moves there for good.
    request = ChoiceRequest(key=b"a", home=URLS[1], blocks=40, block_tokens=16)
    fast = {"prefill_s_per_token": 0.0005, "slots": 4, "slot_time_s": 0.6}
    choice = choose_replica(views(r0={**fast, "matched": 40}, r1={**fast, "load": 3}, r2=fast, r3=fast), request, SETTINGS)
    assert choice.replica == URLS[1] and choice.reason == "home"


def test_no_replica_takes_far_more_than_its_share() -> None:
    # Slots unknown (never seen queueing): the bound is load_factor x the pool average,
    # but never below min_load_bound.
    hot = {"matched": 30, "load": 20}
    choice = choose_replica(views(r0=hot, r1={"load": 2}, r2={"load": 2}, r3={"load": 2}),
                            ChoiceRequest(key=b"hot", home=URLS[0]), SETTINGS)
    assert choice.replica != URLS[0]
    light = choose_replica(views(r0={"matched": 30, "load": 6}), ChoiceRequest(key=b"hot", home=URLS[0]), SETTINGS)
    assert light.replica == URLS[0], "a few requests more than the others is no reason to lose the cache"


def test_a_full_kv_cache_is_avoided_while_another_has_room() -> None:
    choice = choose_replica(views(r0={"matched": 30, "kv_usage": 0.99}), ChoiceRequest(key=b"a", home=URLS[0]), SETTINGS)
    assert choice.replica != URLS[0]


def test_unusable_replicas_are_never_chosen_and_none_left_is_unhealthy() -> None:
    down = {"usable": False, "matched": 30}
    choice = choose_replica(views(r0=down), ChoiceRequest(key=b"a", home=URLS[0]), SETTINGS)
    assert choice.replica in URLS[1:]
    everyone_down = choose_replica(views(r0=down, r1=down, r2=down, r3=down), ChoiceRequest(key=b"a", can_spill=True), SETTINGS)
    assert (everyone_down.replica, everyone_down.spill) == (None, UNHEALTHY)


def test_a_prompt_too_short_to_cache_goes_to_the_least_loaded_and_ties_rotate() -> None:
    loaded = views(r0={"load": 3}, r1={"load": 1}, r2={"load": 0}, r3={"load": 0})
    picks = {choose_replica(loaded, ChoiceRequest(key=None, turn=t), SETTINGS).replica for t in range(8)}
    assert picks == {URLS[2], URLS[3]}


def test_predicted_wait_counts_the_requests_ahead_beyond_the_slots() -> None:
    assert predicted_wait_s(ReplicaView(URLS[0], load=3, slots=4, slot_time_s=2.0)) == 0
    assert predicted_wait_s(ReplicaView(URLS[0], load=7, slots=4, slot_time_s=2.0)) == 4 * 2.0 / 4
    assert predicted_wait_s(ReplicaView(URLS[0], load=7)) == 0, "no basis for a prediction: no wait predicted"


def saturated(load: int) -> list[ReplicaView]:
    full = {"load": load, "slots": 2, "slot_time_s": 1.0}
    return views(r0=full, r1=full, r2=full, r3=full)


def test_a_saturated_pool_spills_when_the_wait_passes_the_limit_or_the_deadline() -> None:
    limit = ChoiceSettings(max_queue_wait_s=1.0)
    # 6 running or waiting on 2 slots: 5 ahead beyond the slots... a wait of 2.5 s.
    choice = choose_replica(saturated(6), ChoiceRequest(key=b"a", can_spill=True), limit)
    assert (choice.replica, choice.spill) == (None, SATURATED)
    assert "2.50s > 1.00s" in choice.detail
    by_deadline = choose_replica(saturated(6), ChoiceRequest(key=b"a", can_spill=True, time_left_s=2.0), SETTINGS)
    assert by_deadline.spill == SATURATED
    assert choose_replica(saturated(6), ChoiceRequest(key=b"a", can_spill=True, time_left_s=60.0), SETTINGS).replica is not None


def test_without_a_fallback_a_saturated_pool_queues_the_request() -> None:
    choice = choose_replica(saturated(6), ChoiceRequest(key=b"a", can_spill=False), ChoiceSettings(max_queue_wait_s=1.0))
    assert choice.replica in URLS and choice.spill is None


def test_a_replica_that_can_start_in_time_is_preferred_to_spilling() -> None:
    busy = {"load": 6, "slots": 2, "slot_time_s": 1.0, "matched": 30}
    quiet = {"load": 1, "slots": 2, "slot_time_s": 1.0}
    choice = choose_replica(views(r0=busy, r1=busy, r2=busy, r3=quiet), ChoiceRequest(key=b"a", home=URLS[0], can_spill=True),
                            ChoiceSettings(max_queue_wait_s=1.0))
    assert choice.replica == URLS[3]


def test_a_short_queue_at_home_beats_a_cold_prefill_elsewhere_a_long_one_does_not() -> None:
    # 40-block prompt, 38 held at home; prefill 0.5 ms a token: a cold replica needs 0.32 s.
    request = ChoiceRequest(key=b"a", home=URLS[0], blocks=40, block_tokens=16)
    fast = {"prefill_s_per_token": 0.0005, "slots": 4, "slot_time_s": 0.6}
    short_queue = views(r0={**fast, "matched": 38, "load": 5}, r1=fast, r2=fast, r3=fast)  # 2 ahead: 0.3 s
    assert choose_replica(short_queue, request, SETTINGS).replica == URLS[0]
    long_queue = views(r0={**fast, "matched": 38, "load": 7}, r1=fast, r2=fast, r3=fast)  # 4 ahead: 0.6 s
    moved = choose_replica(long_queue, request, SETTINGS)
    assert moved.replica != URLS[0] and moved.reason == "overflow"
