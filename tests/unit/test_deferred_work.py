"""Deferred bookkeeping runs while the gateway waits on an upstream, or soon anyway,
and one failing item costs the others nothing."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop

from gateway.deferred_work import DeferredWork


def test_work_waits_for_the_next_upstream_wait_and_runs_there() -> None:
    async def main() -> list[str]:
        backlog, ran = DeferredWork(max_delay_s=60), []
        backlog.add(lambda: ran.append("first answer's books"))
        backlog.add(lambda: ran.append("second answer's books"))
        await asyncio.sleep(0)
        assert ran == [] and len(backlog) == 2, "nothing runs before the loop waits on an upstream"
        backlog.soon()  # a request is about to go upstream
        await asyncio.sleep(0)
        assert len(backlog) == 0
        return ran

    assert asyncio.run(main()) == ["first answer's books", "second answer's books"]


def test_work_runs_within_its_delay_when_no_request_comes() -> None:
    async def main() -> bool:
        backlog, ran = DeferredWork(max_delay_s=0.01), asyncio.Event()
        backlog.add(ran.set)
        await asyncio.wait_for(ran.wait(), timeout=10)
        return ran.is_set()

    assert asyncio.run(main())


def test_a_request_that_arrives_as_the_delay_ends_goes_before_the_books() -> None:
    """On the gateway's loop (uvloop), a due timer runs before what the last turn queued."""
    order: list[str] = []

    def busy_past_the_delay_as_a_request_arrives(loop: asyncio.AbstractEventLoop) -> None:
        time.sleep(0.002)
        loop.call_soon(lambda: order.append("request"))  # the request's first step, queued

    async def main() -> list[str]:
        backlog, booked = DeferredWork(max_delay_s=0.001), asyncio.Event()

        def books() -> None:
            order.append("books")
            booked.set()

        backlog.add(books)
        busy_past_the_delay_as_a_request_arrives(asyncio.get_running_loop())
        await asyncio.wait_for(booked.wait(), timeout=10)
        return order

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == ["request", "books"]


def test_one_failing_item_does_not_cost_the_others(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("a bug in one booking")

    async def main() -> list[int]:
        backlog, ran = DeferredWork(), []
        backlog.add(lambda: ran.append(1))
        backlog.add(broken)
        backlog.add(lambda: ran.append(3))
        backlog.run()
        return ran

    assert asyncio.run(main()) == [1, 3]
    assert "deferred work failed" in caplog.text
