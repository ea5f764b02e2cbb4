"""The bounded admission wait, on virtual time: exact admission and refusal instants,
no real sleeping."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from gateway.admission.buckets import InProcessBuckets, TakeResult
from gateway.admission.queue import AdmissionQueue, Refused
from gateway.types.limits import BucketSpec
from tests.unit.admission.virtual_time import loop_clock, run_virtual

SCOPE = "tenant:acme"
FAR = math.inf  # no deadline beyond max_wait


def bucket(capacity: float, refill_per_s: float, key: str = "tenant:acme:rpm") -> BucketSpec:
    return BucketSpec(key=key, capacity=capacity, refill_per_s=refill_per_s, scope=SCOPE)


def make_queue() -> AdmissionQueue:
    return AdmissionQueue(InProcessBuckets(clock=loop_clock), clock=loop_clock)


async def drain(queue: AdmissionQueue, spec: BucketSpec) -> None:
    """Take the whole bucket so the next request must wait."""
    assert (await queue.admit(SCOPE, [(spec, spec.capacity)], max_queue=0, max_wait_s=0, deadline=FAR)).granted


async def admit_at(queue: AdmissionQueue, spec: BucketSpec, **kwargs: float | int | str) -> float:
    """Admit one unit and return the (virtual) time it was admitted."""
    options: dict[str, Any] = {"max_queue": 10, "max_wait_s": 60.0, "deadline": FAR, **kwargs}
    await queue.admit(SCOPE, [(spec, 1)], **options)
    return loop_clock()


def test_admits_at_once_when_there_is_capacity() -> None:
    async def main() -> tuple[TakeResult, float, float]:
        start = loop_clock()
        result = await make_queue().admit(SCOPE, [(bucket(5, 1), 1)], max_queue=0, max_wait_s=0, deadline=FAR)
        return result, start, loop_clock()

    result, start, end = run_virtual(main)
    assert result.granted and result.remaining == {"tenant:acme:rpm": 4.0} and end == start


def test_a_waiter_is_admitted_the_moment_capacity_refills() -> None:
    async def main() -> float:
        queue, spec = make_queue(), bucket(1, 0.5)
        await drain(queue, spec)
        start = loop_clock()
        return await admit_at(queue, spec, max_wait_s=5) - start

    assert run_virtual(main) == pytest.approx(2.0)


def test_a_full_queue_refuses_immediately_with_the_buckets_wait() -> None:
    async def main() -> None:
        queue, spec = make_queue(), bucket(1, 0.25)
        await drain(queue, spec)
        waiters = [asyncio.create_task(admit_at(queue, spec, max_queue=2)) for _ in range(2)]
        await asyncio.sleep(0)
        assert queue.waiting(SCOPE) == 2
        start = loop_clock()
        with pytest.raises(Refused) as refused:
            await queue.admit(SCOPE, [(spec, 1)], max_queue=2, max_wait_s=60, deadline=FAR)
        assert loop_clock() == start  # refused without waiting
        assert refused.value.reason == "queue_full"
        assert refused.value.retry_after_s == pytest.approx(4.0)
        assert refused.value.response_headers()["retry-after"] == "4"
        assert refused.value.http_status == 429
        assert sorted(await asyncio.gather(*waiters)) == pytest.approx([start + 4, start + 8])
        assert queue.waiting(SCOPE) == 0 and not queue._scopes

    run_virtual(main)


def test_a_wait_longer_than_max_wait_or_the_deadline_is_refused_at_once_and_honestly() -> None:
    async def main() -> None:
        queue, spec = make_queue(), bucket(1, 0.1)
        await drain(queue, spec)
        start = loop_clock()
        with pytest.raises(Refused) as by_max_wait:
            await queue.admit(SCOPE, [(spec, 1)], max_queue=10, max_wait_s=5, deadline=FAR)
        with pytest.raises(Refused) as by_deadline:
            await queue.admit(SCOPE, [(spec, 1)], max_queue=10, max_wait_s=60, deadline=start + 3)
        assert loop_clock() == start
        for refused in (by_max_wait.value, by_deadline.value):
            assert refused.reason == "wait_too_long"
            assert refused.retry_after_s == pytest.approx(10.0)  # when the bucket really has room
            assert not refused.result.granted

    run_virtual(main)


def test_an_overtaken_waiter_is_refused_when_its_time_runs_out_with_the_new_wait() -> None:
    async def main() -> None:
        queue, spec = make_queue(), bucket(1, 0.5)
        await drain(queue, spec)
        start = loop_clock()
        first = asyncio.create_task(admit_at(queue, spec, max_wait_s=3))
        second = asyncio.create_task(admit_at(queue, spec, max_wait_s=3))
        assert await first == pytest.approx(start + 2)
        with pytest.raises(Refused) as refused:
            await second
        # Refused as soon as it lost the token (t+2), since the next one comes at t+4 > t+3.
        assert loop_clock() == pytest.approx(start + 2)
        assert refused.value.retry_after_s == pytest.approx(2.0)

    run_virtual(main)


def test_an_in_process_refund_wakes_a_waiter_early() -> None:
    async def main() -> float:
        queue, spec = make_queue(), bucket(10, 1.0, key="tenant:acme:tpm")
        await drain(queue, spec)
        start = loop_clock()
        waiter = asyncio.create_task(queue.admit(SCOPE, [(spec, 5)], max_queue=10, max_wait_s=10, deadline=FAR))
        await asyncio.sleep(1)
        await queue.adjust(spec, +4)  # a finished request used less than it reserved
        await waiter
        return loop_clock() - start

    assert run_virtual(main) == pytest.approx(1.0)  # not the 5 s the refill alone needs


def test_interactive_goes_before_batch_that_waited_longer() -> None:
    async def main() -> list[tuple[str, float]]:
        queue, spec = make_queue(), bucket(1, 1.0)
        await drain(queue, spec)
        start = loop_clock()
        order: list[tuple[str, float]] = []

        async def request(priority: str) -> None:
            await admit_at(queue, spec, priority=priority)
            order.append((priority, loop_clock() - start))

        batch = asyncio.create_task(request("batch"))
        await asyncio.sleep(0)
        interactive = asyncio.create_task(request("interactive"))
        await asyncio.gather(batch, interactive)
        return order

    assert run_virtual(main) == [("interactive", pytest.approx(1.0)), ("batch", pytest.approx(2.0))]


def test_batch_arriving_behind_interactive_waiters_does_not_take() -> None:
    async def main() -> None:
        queue, spec = make_queue(), bucket(2, 1.0)
        await queue.admit(SCOPE, [(spec, 2)], max_queue=0, max_wait_s=0, deadline=FAR)
        start = loop_clock()
        # The interactive request needs both tokens (2 s); a batch one needing one token
        # could squeeze in at 1 s, but must not while the interactive one waits.
        interactive = asyncio.create_task(queue.admit(SCOPE, [(spec, 2)], max_queue=5, max_wait_s=10, deadline=FAR))
        await asyncio.sleep(0)
        batch_at = await admit_at(queue, spec, priority="batch")
        await interactive
        assert batch_at - start == pytest.approx(3.0)

    run_virtual(main)


def test_batch_yielding_until_its_max_wait_is_refused() -> None:
    async def main() -> None:
        buckets = InProcessBuckets(clock=loop_clock)
        queue = AdmissionQueue(buckets, clock=loop_clock)
        slow_model, tenant = bucket(1, 0.1, key="tenant:acme:slow"), bucket(10, 1.0)
        await drain(queue, slow_model)
        start = loop_clock()
        interactive = asyncio.create_task(admit_at(queue, slow_model, max_wait_s=20))
        await asyncio.sleep(0)
        # The batch request's own bucket has room, but an interactive request waits.
        with pytest.raises(Refused) as refused:
            await admit_at(queue, tenant, priority="batch", max_wait_s=5)
        assert loop_clock() - start == pytest.approx(5.0)
        assert refused.value.reason == "wait_too_long"
        assert refused.value.retry_after_s == 0.0  # its buckets are free; retry-after renders as 1 s
        assert refused.value.response_headers()["retry-after"] == "1"
        assert (await buckets.peek(tenant))[0] == pytest.approx(10.0)  # nothing was taken
        assert await interactive == pytest.approx(start + 10)

    run_virtual(main)


def test_a_request_larger_than_a_bucket_is_refused_for_good() -> None:
    async def main() -> None:
        with pytest.raises(Refused) as refused:
            await make_queue().admit(SCOPE, [(bucket(100, 10, key="tenant:acme:tpm"), 101)], max_queue=5, max_wait_s=60, deadline=FAR)
        assert refused.value.reason == "too_large" and math.isinf(refused.value.retry_after_s)
        headers = refused.value.response_headers()
        assert "retry-after" not in headers and headers["x-should-retry"] == "false"

    run_virtual(main)


def test_a_cancelled_waiter_leaves_the_queue() -> None:
    async def main() -> None:
        queue, spec = make_queue(), bucket(1, 0.1)
        await drain(queue, spec)
        waiter = asyncio.create_task(admit_at(queue, spec))
        await asyncio.sleep(1)
        assert queue.waiting(SCOPE) == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert queue.waiting(SCOPE) == 0 and not queue._scopes

    run_virtual(main)


def test_unknown_priority_is_a_programming_error() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="priority"):
            await make_queue().admit(SCOPE, [], max_queue=1, max_wait_s=1, deadline=FAR, priority="urgent")

    run_virtual(main)
