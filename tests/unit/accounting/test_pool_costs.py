"""A pool's GPU cost split to tenants: the shares plus idle are the pool's cost exactly,
whatever the rates, the period and the usage; each tenant's share follows the stated
rule; what the internal rate recovered is shown beside it."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from sqlalchemy import Engine

from gateway.accounting.database import make_engine, migrate
from gateway.accounting.money import PICO_PER_USD
from gateway.accounting.pool_costs import IDLE, Segment, TenantUsage, apportion, pool_cost_report, segments, split_segment
from gateway.accounting.price_sources import GpuRate
from gateway.accounting.prices import PriceCatalog
from gateway.accounting.tables import usage_events
from gateway.routing.policy import Policy

DAY = datetime(2026, 11, 2, tzinfo=UTC)
RATE = GpuRate(gpu_hour_usd=Decimal("2.50"), gpus=1, replicas=None, input_tps=20000, output_tps=1500)


def usd(text: str) -> int:
    return int(Decimal(text) * PICO_PER_USD)


def test_shares_plus_idle_are_the_pool_cost_exactly_whatever_the_figures() -> None:
    rng = random.Random(7)
    for _ in range(300):
        rate = GpuRate(Decimal(rng.randint(1, 10**11)) / 10**9, rng.randint(1, 8), None, rng.randint(1, 50000), rng.randint(1, 5000))
        start = DAY + timedelta(microseconds=rng.randint(0, 10**9))
        end = start + timedelta(microseconds=rng.randint(1, 10**11))
        usage = [TenantUsage(f"t{i}", uncached_prompt_tokens=rng.randint(0, 10**7), completion_tokens=rng.randint(0, 10**6))
                 for i in range(rng.randint(0, 30))]
        split = split_segment(Segment(start, end, rate, rng.randint(1, 16)), usage)
        assert sum(split.shares.values()) + split.idle_pico == split.cost_pico
        assert split.idle_pico >= 0 and all(v >= 0 for v in split.shares.values())


def test_a_tenants_share_is_its_pool_time_over_the_capacity() -> None:
    # One replica for an hour: $2.50 for 3600 s of capacity. Tenant a: 20,000 uncached
    # prompt tokens (1 s) + 1,500 output tokens (1 s) = 2 s; b: 4 s; cached tokens are free.
    hour = Segment(DAY, DAY + timedelta(hours=1), RATE, 1)
    split = split_segment(hour, [TenantUsage("a", uncached_prompt_tokens=20000, cached_tokens=10**6, completion_tokens=1500),
                                 TenantUsage("b", uncached_prompt_tokens=40000, completion_tokens=3000)])
    assert split.cost_pico == usd("2.50")
    # $2.50 x 2/3600 = 1,388,888,888.9 pico and x 4/3600 = 2,777,777,777.8: the two odd picos go
    # to the largest remainders.
    assert split.shares == {"a": 1_388_888_889, "b": 2_777_777_778}
    assert split.idle_pico == usd("2.50") - sum(split.shares.values())
    assert split.busy_s == {"a": 2, "b": 4}


def test_a_pool_busier_than_its_rating_has_no_idle_and_the_cost_is_split_by_time() -> None:
    second = Segment(DAY, DAY + timedelta(seconds=1), RATE, 1)
    split = split_segment(second, [TenantUsage("a", uncached_prompt_tokens=60000), TenantUsage("b", uncached_prompt_tokens=20000)])
    assert split.idle_pico == 0
    assert split.shares["a"] == 3 * split.shares["b"] and sum(split.shares.values()) == split.cost_pico


def test_apportion_gives_every_unit_to_someone() -> None:
    assert apportion(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert apportion(7, {"a": 0, IDLE: 0}) == {"a": 0, IDLE: 7}


def test_rate_changes_cut_the_period() -> None:
    later = GpuRate(Decimal("3.00"), 2, 3, 20000, 1500)
    cut = segments([(date(2026, 11, 3), later), (date(2026, 11, 1), RATE)], 4, DAY, DAY + timedelta(days=2))
    assert [(s.start.day, s.end.day, s.replicas, s.rate.gpu_hour_usd) for s in cut] == [(2, 3, 4, Decimal("2.50")),
                                                                                          (3, 4, 3, Decimal("3.00"))]


# -- from the ledger ------------------------------------------------------------------


def ledger(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}", writer=True)
    migrate(engine)
    return engine


def book(engine: Engine, tenant: str, at: datetime, prompt: int, cached: int, completion: int, cost_usd: str,
         replica: str = "http://r0/v1", upstream: str = "pool") -> None:
    with engine.begin() as conn:
        conn.execute(usage_events.insert().values(
            request_id=f"req-{random.random()}", tenant=tenant, key_id="k", endpoint="chat.completions", model="pool-model",
            upstream=upstream, replica=replica, status="ok", usage_known=True, prompt_tokens=prompt, cached_tokens=cached,
            completion_tokens=completion, cost_pico=usd(cost_usd), created_at=at, day=at.date().isoformat()))


def policy() -> Policy:
    return Policy.model_validate({
        "version": 1,
        "upstreams": {"pool": {"kind": "vllm", "replicas": ["http://r0/v1", "http://r1/v1"]},
                      "hosted": {"kind": "openai", "base_url": "http://h/v1"}},
        "models": {"pool-model": {"upstream": "pool"}, "gpt": {"upstream": "hosted", "price": {"input": 1, "output": 1}}},
    })


def catalog(tmp_path: Path) -> PriceCatalog:
    pricing = tmp_path / "pricing"
    pricing.mkdir()
    (pricing / "selfhosted.yaml").write_text(
        "kind: gpu_hours\nentries:\n"
        "  - {model: pool-model, effective_from: 2026-11-01, gpu_hour_usd: 2.50, gpus: 1,"
        " expected_tokens_per_second: {input: 20000, output: 1500}, note: test}\n"
        "  - {model: pool-model, effective_from: 2026-11-03, gpu_hour_usd: 1.99, gpus: 2, replicas: 3,"
        " expected_tokens_per_second: {input: 20000, output: 1500}, note: test}\n")
    return PriceCatalog.load(pricing, litellm_json=tmp_path / "no-map.json")


def test_the_report_splits_a_pools_days_to_tenants_and_idle_exactly(tmp_path: Path) -> None:
    engine = ledger(tmp_path)
    rng = random.Random(1)
    for i in range(200):
        at = DAY + timedelta(seconds=rng.randint(0, 2 * 86400 - 1))
        prompt = rng.randint(100, 5000)
        book(engine, f"t{i % 7}", at, prompt, rng.randint(0, prompt), rng.randint(1, 500), f"0.0000{rng.randint(1, 99)}",
             replica=f"http://r{i % 2}/v1")
    book(engine, "t0", DAY, 10**6, 0, 0, "9.99", upstream="hosted")  # not the pool's
    report = pool_cost_report(engine, policy(), catalog(tmp_path), "pool", DAY, DAY + timedelta(days=2))
    # Day one: 2 replicas (the policy's) x 1 GPU x $2.50 x 24 h; day two: 3 replicas x 2 GPUs x $1.99 x 24 h.
    assert Decimal(report["cost_usd"]) == Decimal("2") * Decimal("2.50") * 24 + Decimal("6") * Decimal("1.99") * 24
    shares = sum(Decimal(t["share_usd"]) for t in report["tenants"])
    assert shares + Decimal(report["idle_usd"]) == Decimal(report["cost_usd"])
    recovered = sum(Decimal(t["recovered_usd"]) for t in report["tenants"])
    assert recovered == Decimal(report["recovered_usd"])
    assert Decimal(report["recovered_minus_cost_usd"]) == recovered - Decimal(report["cost_usd"])
    assert {t["tenant"] for t in report["tenants"]} == {f"t{i}" for i in range(7)}
    assert [r["replica"] for r in report["replicas"]] == ["http://r0/v1", "http://r1/v1"]
    assert sum(r["requests"] for r in report["replicas"]) == 200


def test_a_pool_without_a_gpu_rate_says_so(tmp_path: Path) -> None:
    engine = ledger(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    report = pool_cost_report(engine, policy(), PriceCatalog.load(empty, litellm_json=tmp_path / "x.json"), "pool",
                              DAY, DAY + timedelta(days=1))
    assert "cost_usd" not in report and "cannot be split" in report["notes"][0]
