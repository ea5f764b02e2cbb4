"""Behaviour every `Buckets` store must show, run against the in-process store here and
against Redis in tests/integration/admission. Each check takes a fresh store.

Checks that pass explicit times use `take(now=...)` only; checks that adjust or peek
use buckets that practically never refill, so the store's own clock cannot matter.
"""

from __future__ import annotations

import math

import pytest

from gateway.admission.buckets import Buckets
from gateway.types.limits import BucketSpec

T0 = 1_000_000.0
NEVER_REFILLS = 1e-9  # tokens per second: not one token over any test's lifetime


def spec(key: str, capacity: float, refill_per_s: float, scope: str = "tenant:acme") -> BucketSpec:
    return BucketSpec(key=f"{scope}:{key}", capacity=capacity, refill_per_s=refill_per_s, scope=scope)


async def refill_math(buckets: Buckets) -> None:
    rpm = spec("rpm", 10, 1.0)
    first = await buckets.take([(rpm, 10)], now=T0)
    assert first.granted and first.remaining[rpm.key] == 0 and first.reset_s[rpm.key] == pytest.approx(10.0)
    refused = await buckets.take([(rpm, 1)], now=T0)
    assert not refused.granted and refused.wait_s == pytest.approx(1.0) and refused.remaining[rpm.key] == 0
    later = await buckets.take([(rpm, 2)], now=T0 + 2.5)
    assert later.granted and later.remaining[rpm.key] == pytest.approx(0.5)
    assert later.reset_s[rpm.key] == pytest.approx(9.5)
    # Refill stops at capacity however long the bucket sits idle.
    idle = await buckets.take([(rpm, 1)], now=T0 + 3600)
    assert idle.remaining[rpm.key] == pytest.approx(9.0)


async def all_or_nothing(buckets: Buckets) -> None:
    rpm, tpm = spec("rpm", 10, NEVER_REFILLS), spec("tpm", 100, NEVER_REFILLS)
    assert (await buckets.take([(rpm, 1), (tpm, 90)], now=T0)).granted
    refused = await buckets.take([(rpm, 1), (tpm, 20)], now=T0)
    assert not refused.granted
    assert refused.remaining == pytest.approx({rpm.key: 9, tpm.key: 10})
    # The bucket that had room was not charged for the refused take.
    assert (await buckets.take([(rpm, 9)], now=T0)).granted


async def debt_after_adjust(buckets: Buckets) -> None:
    tpm = spec("tpm", 100, NEVER_REFILLS)
    assert (await buckets.take([(tpm, 50)])).granted
    await buckets.adjust(tpm, -120)  # real usage was 170, not the estimated 50
    remaining, reset = await buckets.peek(tpm)
    assert remaining == pytest.approx(-70, abs=1e-3)
    assert reset == pytest.approx(170 / NEVER_REFILLS, rel=1e-3)
    refused = await buckets.take([(tpm, 1)])
    assert not refused.granted and refused.wait_s == pytest.approx(71 / NEVER_REFILLS, rel=1e-3)
    await buckets.adjust(tpm, 1000)  # a refund never lifts a bucket past capacity
    assert (await buckets.peek(tpm))[0] == pytest.approx(100)


async def too_large_never_fits(buckets: Buckets) -> None:
    tpm = spec("tpm", 100, 100 / 60)
    refused = await buckets.take([(tpm, 101)], now=T0)
    assert not refused.granted and math.isinf(refused.wait_s) and not refused.admissible
    assert (await buckets.take([(tpm, 100)], now=T0)).granted


async def same_bucket_twice_is_charged_once_for_both(buckets: Buckets) -> None:
    rpm = spec("rpm", 3, NEVER_REFILLS)
    assert not (await buckets.take([(rpm, 2), (rpm, 2)], now=T0)).granted
    granted = await buckets.take([(rpm, 1), (rpm, 2)], now=T0)
    assert granted.granted and granted.remaining[rpm.key] == pytest.approx(0)


async def cross_scope_refusal_leaks_nothing(buckets: Buckets) -> None:
    tenant = spec("rpm", 5, NEVER_REFILLS, scope="tenant:acme")
    model = spec("tpm", 100, NEVER_REFILLS, scope="model:gpt-x")
    assert (await buckets.take([(tenant, 1), (model, 95)])).granted
    refused = await buckets.take([(tenant, 1), (model, 10)])
    assert not refused.granted
    assert refused.wait_s == pytest.approx(5 / NEVER_REFILLS, rel=1e-3)
    assert refused.remaining == pytest.approx({tenant.key: 4, model.key: 5}, abs=1e-3)
    assert (await buckets.peek(tenant))[0] == pytest.approx(4, abs=1e-3)
    assert (await buckets.peek(model))[0] == pytest.approx(5, abs=1e-3)
    # And the other way round: the tenant (sorted last) refuses after the model took.
    assert (await buckets.take([(tenant, 4), (model, 1)])).granted
    refused = await buckets.take([(tenant, 1), (model, 1)])
    assert not refused.granted
    assert (await buckets.peek(model))[0] == pytest.approx(4, abs=1e-3)
    assert (await buckets.peek(tenant))[0] == pytest.approx(0, abs=1e-3)


CHECKS = [
    refill_math,
    all_or_nothing,
    debt_after_adjust,
    too_large_never_fits,
    same_bucket_twice_is_charged_once_for_both,
    cross_scope_refusal_leaks_nothing,
]
