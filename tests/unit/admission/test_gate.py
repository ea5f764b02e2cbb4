"""The admission gate on the request path, on fake upstreams: request and token
buckets, a bounded queue in front of them, the refund of unused tokens that lets a
waiter in, and a client that hangs up while waiting leaving the queue."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

from gateway.admission.queue import Refused
from gateway.errors import GatewayError
from gateway.pipeline.runner import JsonReply
from tests.fakes.gateway import FakeGateway, chat, make_calls, policy, upstreams, with_gateway
from tests.fakes.upstream import FakeUpstream, Reply, Sent, answer

SCOPE = "tenant:metered"


def metered(**limits: Any) -> dict[str, Any]:
    return policy(metered={"key": "sk-metered", "limits": limits}, other={"key": "sk-other"})


def test_requests_over_the_tenants_rpm_are_refused_with_when_to_come_back(tmp_path: Path) -> None:
    fakes = upstreams()
    outcome = make_calls(tmp_path, fakes, *[{"key": "sk-metered"}] * 3, policy_fields=metered(rpm=2, max_queue=0))
    first, second, third = outcome.replies
    assert first.headers["x-ratelimit-limit-requests"] == "2" and first.headers["x-ratelimit-remaining-requests"] == "1"
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    assert isinstance(third, Refused) and third.reason == "queue_full" and third.http_status == 429
    headers = third.response_headers()
    assert 29 <= int(headers["retry-after"]) <= 30 and headers["x-ratelimit-remaining-requests"] == "0"
    assert len(fakes["hosted"].sent) == 2


def test_one_tenants_limit_leaves_another_tenant_alone(tmp_path: Path) -> None:
    outcome = make_calls(tmp_path, upstreams(), {"key": "sk-metered"}, {"key": "sk-metered"}, {"key": "sk-other"},
                         policy_fields=metered(rpm=1, max_queue=0))
    assert [type(r) for r in outcome.replies] == [JsonReply, Refused, JsonReply]


def test_a_models_limit_is_shared_by_every_tenant(tmp_path: Path) -> None:
    fields = copy.deepcopy(metered())
    fields["models"]["small"]["limits"] = {"rpm": 1}
    outcome = make_calls(tmp_path, upstreams(), {"key": "sk-metered"}, {"key": "sk-other"}, policy_fields=fields)
    assert isinstance(outcome.replies[0], JsonReply) and isinstance(outcome.replies[1], GatewayError)


def test_a_request_that_cannot_fit_the_tpm_limit_is_refused_for_good(tmp_path: Path) -> None:
    outcome = make_calls(tmp_path, upstreams(), {"key": "sk-metered"}, policy_fields=metered(tpm=50))
    (reply,) = outcome.replies
    assert isinstance(reply, Refused) and reply.reason == "too_large"
    assert reply.response_headers()["x-should-retry"] == "false"


async def until_waiting(gw: FakeGateway, count: int) -> None:
    for _ in range(1000):
        if gw.pipeline.parts.admission.queue.waiting(SCOPE) == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{count} request(s) never waited in the queue")


def test_a_waiter_is_let_in_when_a_call_gives_back_the_tokens_it_did_not_use(tmp_path: Path) -> None:
    """Each call takes its prompt plus its 100-token output bound up front; the first
    used 15 in all, so its refund makes room for the second at once."""
    release, arrived = asyncio.Event(), asyncio.Event()
    hosted = FakeUpstream("hosted", Reply(**{**vars_of(answer(prompt=10, completion=5)), "held_until": release}), answer())

    async def on_call(_: Sent) -> None:
        arrived.set()

    hosted.on_call = on_call

    async def scenario(gw: FakeGateway) -> list[Any]:
        first = asyncio.create_task(gw.call(chat(), key="sk-metered"))
        await arrived.wait()
        second = asyncio.create_task(gw.call(chat(), key="sk-metered"))
        await until_waiting(gw, 1)
        assert len(hosted.sent) == 1, "the second waits in the queue"
        release.set()
        return list(await asyncio.gather(first, second))

    replies = with_gateway(tmp_path, upstreams(hosted=hosted), scenario, metered(tpm=150, max_wait_s=60))
    assert all(isinstance(r, JsonReply) for r in replies) and len(hosted.sent) == 2


def test_the_queue_is_bounded_and_a_client_that_hangs_up_leaves_it(tmp_path: Path) -> None:
    async def scenario(gw: FakeGateway) -> tuple[Any, Any, int]:
        await gw.call(chat(), key="sk-metered")  # takes the one request a minute
        waiter = asyncio.create_task(gw.call(chat(), key="sk-metered", x_request_timeout="300"))
        await until_waiting(gw, 1)
        try:
            await gw.call(chat(), key="sk-metered", x_request_timeout="300")
        except GatewayError as exc:
            full: Any = exc
        waiter.cancel()  # the client hangs up while it waits
        await asyncio.gather(waiter, return_exceptions=True)
        left = gw.pipeline.parts.admission.queue.waiting(SCOPE)
        again = asyncio.create_task(gw.call(chat(), key="sk-metered", x_request_timeout="300"))
        await until_waiting(gw, 1)  # queued this time, not refused
        again.cancel()
        await asyncio.gather(again, return_exceptions=True)
        return full, await gw.holds(), left

    fakes = upstreams()
    full, holds, left = with_gateway(tmp_path, fakes, scenario, metered(rpm=1, max_queue=1, max_wait_s=120))
    assert isinstance(full, Refused) and full.reason == "queue_full"
    assert left == 0
    assert len(holds) == 1 and len(fakes["hosted"].sent) == 1, "the waiters never held nor called"


def vars_of(reply: Reply) -> dict[str, Any]:
    return {name: getattr(reply, name) for name in Reply.__dataclass_fields__}
