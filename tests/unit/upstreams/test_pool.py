"""A pool's live state, without HTTP: what it learns from its replicas' metrics, how it
takes replicas out and back, drains the ones a policy edit removes, and spills."""

from __future__ import annotations

import logging

import pytest

from gateway.errors import PoolSpill
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.base import PoolRequest
from gateway.upstreams.pool import Pool
from gateway.upstreams.pool_metrics import ReplicaMetrics, parse_replica_metrics

URLS = ["http://r0:8000/v1", "http://r1:8000/v1", "http://r2:8000/v1"]
SYSTEM = "You are the assistant of a bicycle shop; answer briefly and politely. " * 12


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pool(urls: list[str] = URLS, **settings: object) -> tuple[Pool, Clock]:
    clock = Clock()
    config = UpstreamConfig.model_validate({"kind": "vllm", "replicas": urls, "pool": settings})
    return Pool("pool", config, clock=clock), clock


def request(tenant: str = "acme", question: str = "hi", can_spill: bool = False, deadline: float = 1e9) -> PoolRequest:
    return PoolRequest(tenant, f"system\x00{SYSTEM}\x00user\x00{question}\x00", f"salt-{tenant}", deadline, can_spill)


def test_a_tenants_requests_stay_on_one_replica_and_tenants_spread() -> None:
    p, _ = pool()
    placed = {}
    for tenant in ("acme", "globex", "initech", "umbrella", "hooli", "stark"):
        chosen = set()
        for n in range(5):
            replica = p.choose(request(tenant, f"q{n}"))
            chosen.add(replica.url)
            p.finished(replica)
        assert len(chosen) == 1
        placed[tenant] = chosen.pop()
    assert len(set(placed.values())) >= 2


METRICS = """\
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.5
vllm:prompt_tokens_total{{engine="0",model_name="m"}} {prompt}
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {prompt}
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="m"}} {e2e}
vllm:e2e_request_latency_seconds_count{{engine="0",model_name="m"}} {done}
vllm:request_queue_time_seconds_sum{{engine="0",model_name="m"}} {queue}
vllm:request_prefill_time_seconds_sum{{engine="0",model_name="m"}} {prefill}
vllm:cache_config_info{{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="512"}} 1.0
"""


def metrics(**values: float) -> ReplicaMetrics:
    base = {"running": 0, "waiting": 0, "prompt": 0, "hits": 0, "e2e": 0, "done": 0, "queue": 0, "prefill": 0}
    return parse_replica_metrics(METRICS.format(**(base | values)))


def test_the_pool_learns_slots_slot_time_prefill_speed_and_kv_size_from_metrics() -> None:
    p, clock = pool()
    replica = p.replicas[URLS[0]]
    p.probed(replica, True, metrics(running=4, waiting=3, prompt=1000, done=10, e2e=30.0, queue=10.0, prefill=1.0))
    clock.now += 1
    p.probed(replica, True, metrics(running=4, waiting=0, prompt=3000, hits=1000, done=20, e2e=55.0, queue=15.0, prefill=1.5))
    view = p.snapshot()["replicas"][0]
    assert view["slots"] == 4, "it ran 4 while others waited"
    assert view["slot_time_s"] == pytest.approx((25.0 - 5.0) / 10), "a request held a slot 2 s, queue time excluded"
    assert view["prefill_ms_per_1k_tokens"] == pytest.approx(0.5 / 1000 * 1e6)  # 0.5 s for 1,000 uncached tokens
    assert view["prefix_hit_rate"] == 0.5
    assert view["index_capacity"] == 512, "sized from vllm:cache_config_info"


def test_a_replica_that_fails_is_taken_out_and_comes_back_with_its_cache_forgotten_if_it_restarted() -> None:
    p, _ = pool()
    first = p.choose(request())
    p.finished(first)
    p.probed(first, True, metrics(prompt=5000, done=50))
    assert p.unreachable(first, "ServerDisconnectedError") is True, "two other replicas can take over"
    assert all(p.choose(request(question=f"q{n}")).url != first.url for n in range(10))
    p.probed(first, True, metrics(prompt=10, done=1))  # /health is 200 again; its counters restarted
    assert first.healthy and p.index.size(first.url) == 0


def test_server_errors_in_a_row_take_a_replica_out_and_a_success_resets_the_count() -> None:
    p, _ = pool(eject_after_errors=3)
    replica = p.replicas[URLS[1]]
    for status in (500, 502, 200, 500, 503):
        p.answered(replica, status)
    assert replica.healthy
    p.answered(replica, 500)
    assert not replica.healthy and "5xx" in (replica.ejected_because or "")


def test_a_replica_removed_by_a_policy_edit_drains_then_leaves() -> None:
    p, _ = pool()
    busy = p.choose(request())
    p.reconfigure(UpstreamConfig.model_validate({"kind": "vllm", "replicas": [u for u in URLS if u != busy.url]}))
    assert busy.url in p.replicas and p.replicas[busy.url].draining, "its request in flight keeps it"
    assert all(p.choose(request(question=f"q{n}")).url != busy.url for n in range(10))
    p.finished(busy)
    assert busy.url not in p.replicas


def test_no_healthy_replica_spills_when_a_fallback_exists_else_tries_them_anyway() -> None:
    p, _ = pool()
    for replica in list(p.replicas.values()):
        p.eject(replica, "test")
    with pytest.raises(PoolSpill) as spilled:
        p.choose(request(can_spill=True))
    assert spilled.value.reason == "unhealthy"
    assert p.choose(request(can_spill=False)).url in URLS


def test_a_saturated_pool_spills_only_what_cannot_start_in_time() -> None:
    p, clock = pool(URLS[:1], max_num_seqs=1, max_queue_wait_s=1.0)
    replica = p.replicas[URLS[0]]
    p.probed(replica, True, metrics(done=1, e2e=2.0))
    clock.now += 1
    p.probed(replica, True, metrics(done=2, e2e=4.0))  # a request holds the one slot 2 s
    assert p.choose(request(can_spill=True)) is replica
    with pytest.raises(PoolSpill) as spilled:
        p.choose(request(can_spill=True))
    assert spilled.value.reason == "saturated" and "2.00s > 1.00s" in spilled.value.message
    p.finished(replica)
    assert p.choose(request(can_spill=True)) is replica, "drained: back to the pool"
    assert p.snapshot()["choices"]["saturated"] == 1


def test_a_replica_not_up_yet_is_no_warning_but_one_that_fails_after_answering_is(caplog: pytest.LogCaptureFixture) -> None:
    # The gateway often starts before its pool: a replica that has never answered is starting, not failing.
    p, _ = pool()
    replica = p.replicas[URLS[0]]
    with caplog.at_level(logging.INFO, logger="gateway.pool"):
        p.probed(replica, False, None, "ClientConnectorError")
        p.probed(replica, True, None)
        p.probed(replica, False, None, "ClientConnectorError")
        p.probed(replica, True, None)
    said = [(r.levelname, r.getMessage().split(URLS[0])[1]) for r in caplog.records]
    assert said == [("INFO", " not up yet: ClientConnectorError"), ("INFO", " is up"),
                    ("WARNING", " taken out: ClientConnectorError"), ("WARNING", " is back")]
