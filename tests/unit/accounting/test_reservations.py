"""A request's reservation from the ledger's side, on fake upstreams: an answered call
is settled at its usage, a failed one released, and a call whose usage never came (the
client left, the stream was cut) booked at the gateway's estimate - never at $0."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

from gateway.errors import GatewayError
from gateway.pipeline.runner import StreamReply
from tests.fakes.gateway import FakeGateway, chat, make_calls, pico, policy, upstreams, with_gateway
from tests.fakes.upstream import FakeUpstream, Reply, Sent, answer, error, streamed

RICH = policy(rich={"key": "sk-rich", "budget": {"usd": 10}})
Books = tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, dict[str, Any]]]


async def books(gw: FakeGateway) -> Books:
    return await gw.events(), await gw.holds(), await gw.budgets()


def test_settling_books_the_usage_against_the_budget_and_frees_the_rest(tmp_path: Path) -> None:
    async def scenario(gw: FakeGateway) -> Books:
        await gw.call(chat(), key="sk-rich")
        return await books(gw)

    events, holds, budgets = with_gateway(tmp_path, upstreams(hosted=answer(prompt=40, completion=9)), scenario, RICH)
    cost = pico(40, 9, 1, 2)
    (budget,) = budgets.values()
    assert (budget["spent_pico"], budget["reserved_pico"], budget["tokens_used"]) == (cost, 0, 49)
    assert [(h["state"], h["settled_pico"]) for h in holds] == [("settled", cost)]
    assert holds[0]["amount_pico"] > cost, "the hold was the worst case"
    assert [e["cost_pico"] for e in events] == [cost]


def test_a_failed_call_releases_its_hold(tmp_path: Path) -> None:
    outcome = make_calls(tmp_path, upstreams(hosted=error(400)), {"key": "sk-rich"}, policy_fields=RICH)
    assert isinstance(outcome.replies[0], GatewayError)
    assert [(h["state"], h["settled_pico"]) for h in outcome.holds] == [("released", 0)]
    assert [e["cost_pico"] for e in outcome.events] == [0]


def cancelled_midway(tmp_path: Path, reply: Reply, read_chunks: int) -> tuple[Books, Sent]:
    """Start a call whose upstream hangs (after `read_chunks` streamed chunks, if it
    streams), then leave as a client that hangs up does: the task is cancelled."""
    hosted = FakeUpstream("hosted", reply)
    arrived = asyncio.Event()

    async def on_call(_: Sent) -> None:
        arrived.set()

    hosted.on_call = on_call

    async def scenario(gw: FakeGateway) -> Books:
        async def client() -> None:
            out = await gw.call(chat("Tell me a long story.", stream=reply.chunks is not None), key="sk-rich")
            if isinstance(out, StreamReply):
                chunks = cast(AsyncGenerator[bytes, None], out.chunks)
                try:
                    for _ in range(read_chunks):
                        await anext(chunks)
                    await asyncio.Event().wait()  # reading on, until it hangs up
                finally:
                    await chunks.aclose()  # as the server does with a reply it stops sending

        task = asyncio.create_task(client())
        await arrived.wait()
        for _ in range(read_chunks + 5):  # let it reach the hang
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return await books(gw)

    return with_gateway(tmp_path, {"hosted": hosted}, scenario, RICH), hosted.sent[0]


def test_a_call_the_client_left_is_booked_at_its_estimate_never_at_zero(tmp_path: Path) -> None:
    (events, holds, budgets), sent = cancelled_midway(tmp_path, Reply(hang=True), 0)
    assert sent.cancelled, "the upstream call was abandoned, not left running"
    (event,) = events
    assert (event["status"], event["usage_known"], event["estimated"]) == ("cancelled", 0, 1)
    assert 0 < event["cost_pico"] <= holds[0]["amount_pico"]
    assert holds[0]["state"] == "settled" and holds[0]["settled_pico"] == event["cost_pico"]
    (budget,) = budgets.values()
    assert budget["spent_pico"] == event["cost_pico"] and budget["reserved_pico"] == 0


def test_a_stream_the_client_left_is_booked_at_what_it_was_sent(tmp_path: Path) -> None:
    story = streamed("Once", " upon", " a", " time", with_usage=False, done=False)
    (events, holds, _), sent = cancelled_midway(tmp_path, Reply(200, chunks=story.chunks, hang=True), 3)
    assert sent.closed, "the upstream stream was closed, which aborts the generation"
    (event,) = events
    assert (event["status"], event["estimated"]) == ("cancelled", 1)
    assert event["completion_tokens"] > 0, "what reached the client is counted"
    assert 0 < event["cost_pico"] <= holds[0]["amount_pico"]


def test_a_bug_mid_call_still_ends_the_reservation(tmp_path: Path) -> None:
    hosted = FakeUpstream("hosted", answer())

    async def bug(_: Sent) -> None:
        raise RuntimeError("a bug in the gateway")

    hosted.on_call = bug

    async def scenario(gw: FakeGateway) -> Books:
        try:
            await gw.call(chat(), key="sk-rich")
        except RuntimeError:
            pass
        return await books(gw)

    events, holds, budgets = with_gateway(tmp_path, {"hosted": hosted}, scenario, RICH)
    # The call may have reached the provider: booked at its estimate, and nothing left held.
    (event,) = events
    assert (event["status"], event["estimated"]) == ("pending", 1) and event["cost_pico"] > 0
    assert [(h["state"], h["settled_pico"]) for h in holds] == [("settled", event["cost_pico"])]
    (budget,) = budgets.values()
    assert (budget["reserved_pico"], budget["spent_pico"]) == (0, event["cost_pico"])
