"""In-process token buckets: the shared contract, plus what only a local clock can show."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from gateway.admission.buckets import Buckets, InProcessBuckets
from gateway.types.limits import BucketSpec
from tests.unit.admission import contract


class FakeClock:
    def __init__(self, now: float = contract.T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("check", contract.CHECKS, ids=lambda check: check.__name__)
def test_contract(check: Callable[[Buckets], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(check(InProcessBuckets(clock=FakeClock())))


def test_refill_follows_the_clock_between_take_adjust_and_peek() -> None:
    clock = FakeClock()
    buckets = InProcessBuckets(clock=clock)
    tpm = contract.spec("tpm", 60, 1.0)

    async def scenario() -> None:
        assert (await buckets.take([(tpm, 60)])).granted
        clock.now += 10
        assert await buckets.peek(tpm) == (pytest.approx(10), pytest.approx(50))
        await buckets.adjust(tpm, -30)  # debt: 10 - 30
        assert (await buckets.peek(tpm))[0] == pytest.approx(-20)
        refused = await buckets.take([(tpm, 5)])
        assert refused.wait_s == pytest.approx(25)  # pay off 20 of debt, then 5 more
        clock.now += 25
        assert (await buckets.take([(tpm, 5)])).granted

    asyncio.run(scenario())


def test_a_clock_stepping_back_creates_no_tokens() -> None:
    buckets = InProcessBuckets(clock=FakeClock())
    rpm = contract.spec("rpm", 2, 1.0)

    async def scenario() -> None:
        assert (await buckets.take([(rpm, 2)], now=contract.T0 + 10)).granted
        assert not (await buckets.take([(rpm, 1)], now=contract.T0)).granted
        # Refill resumes from the latest time seen, not from the earlier one.
        assert not (await buckets.take([(rpm, 1)], now=contract.T0 + 10.5)).granted
        assert (await buckets.take([(rpm, 1)], now=contract.T0 + 11)).granted

    asyncio.run(scenario())


def test_full_buckets_are_forgotten() -> None:
    clock = FakeClock()
    buckets = InProcessBuckets(clock=clock)

    async def scenario() -> None:
        for i in range(3000):
            spec = contract.spec(f"rpm{i}", 10, 10.0, scope=f"tenant:t{i}")
            assert (await buckets.take([(spec, 1)])).granted
            clock.now += 0.01  # each bucket is full again 0.1 s after its take

    asyncio.run(scenario())
    assert len(buckets._levels) < 1100


def test_zero_limit_admits_nothing() -> None:
    closed = BucketSpec(key="tenant:acme:rpm", capacity=0, refill_per_s=0, scope="tenant:acme")
    result = asyncio.run(InProcessBuckets().take([(closed, 1)]))
    assert not result.granted and not result.admissible


@pytest.mark.parametrize(("capacity", "refill"), [(-1, 1), (float("inf"), 1), (1, float("nan")), (1, -0.5)])
def test_bad_specs_fail_at_construction(capacity: float, refill: float) -> None:
    with pytest.raises(ValueError, match="finite and >= 0"):
        BucketSpec(key="k", capacity=capacity, refill_per_s=refill, scope="s")


def test_negative_take_amounts_are_rejected() -> None:
    with pytest.raises(ValueError, match="finite and >= 0"):
        asyncio.run(InProcessBuckets().take([(contract.spec("rpm", 1, 1), -1)]))
