"""A route with checks, on fake upstreams: a failed check moves up the chain, the
answer that passes (or the last one) is returned, and every attempt is booked."""

from __future__ import annotations

import copy
from pathlib import Path

import orjson

from gateway.caching.replay import completion_from_stream
from gateway.pipeline.runner import JsonReply, StreamReply
from tests.fakes.gateway import BASE_POLICY, FakeGateway, chat, make_calls, pico, policy, upstreams, with_gateway
from tests.fakes.upstream import answer, error

CUT = answer("Half an ans", prompt=10, completion=5, finish_reason="length")


def content(reply: JsonReply) -> str:
    return str(orjson.loads(reply.body)["choices"][0]["message"]["content"])


def test_a_failed_check_escalates_and_both_attempts_are_booked(tmp_path: Path) -> None:
    fakes = upstreams(hosted=CUT, backup=answer("A whole answer.", prompt=10, completion=4))
    outcome = make_calls(tmp_path, fakes, {"body": chat(model="checked")})
    (reply,) = outcome.replies
    assert isinstance(reply, JsonReply) and content(reply) == "A whole answer."
    assert reply.headers["x-gateway-model"] == "large" and reply.headers["x-gateway-escalations"] == "1"
    assert [b["model"] for b in fakes["hosted"].bodies] == ["small-v1"] and [b["model"] for b in fakes["backup"].bodies] == ["large"]
    both = pico(10, 5, 1, 2) + pico(10, 4, 10, 20)
    assert [(e["model"], e["checks"], e["escalation"]) for e in outcome.events] == [
        ("small", "failed: truncated", "truncated -> large"), ("large", "passed", None)]
    assert sum(e["cost_pico"] for e in outcome.events) == both
    assert reply.headers["x-gateway-cost-usd"] == f"{both / 1e12:.6f}"


def test_an_answer_that_passes_goes_back_without_escalating(tmp_path: Path) -> None:
    fakes = upstreams()
    outcome = make_calls(tmp_path, fakes, {"body": chat(model="checked")})
    (reply,) = outcome.replies
    assert isinstance(reply, JsonReply) and reply.headers["x-gateway-escalations"] == "0"
    assert fakes["backup"].sent == [] and [e["checks"] for e in outcome.events] == ["passed"]


def test_when_the_last_model_fails_its_check_too_its_answer_is_returned(tmp_path: Path) -> None:
    fakes = upstreams(hosted=CUT, backup=answer("Also cut", finish_reason="length"))
    outcome = make_calls(tmp_path, fakes, {"body": chat(model="checked")})
    (reply,) = outcome.replies
    assert isinstance(reply, JsonReply) and content(reply) == "Also cut" and reply.headers["x-gateway-model"] == "large"
    assert [e["checks"] for e in outcome.events] == ["failed: truncated", "failed: truncated"]


def test_a_high_risk_task_goes_straight_to_the_strongest_model(tmp_path: Path) -> None:
    fakes = upstreams()
    outcome = make_calls(tmp_path, fakes, {"body": chat(model="checked"), "x_task_risk": "high"})
    assert outcome.replies[0].headers["x-gateway-model"] == "large"
    assert fakes["hosted"].sent == [] and len(outcome.events) == 1


def test_when_the_next_model_fails_the_answer_in_hand_is_returned(tmp_path: Path) -> None:
    fields = copy.deepcopy(BASE_POLICY)
    fields["defaults"]["retry"]["max_attempts"] = 1
    fakes = upstreams(hosted=CUT, backup=error(500))
    outcome = make_calls(tmp_path, fakes, {"body": chat(model="checked")}, policy_fields=fields)
    (reply,) = outcome.replies
    assert isinstance(reply, JsonReply) and content(reply) == "Half an ans"
    assert reply.headers["x-gateway-escalation-stopped"] == "upstream_error"
    assert [e["status"] for e in outcome.events] == ["ok", "error"]


def test_when_the_budget_cannot_afford_the_next_model_the_answer_in_hand_is_returned(tmp_path: Path) -> None:
    # Enough for small's worst case (597 prompt tokens by the bound, 100 out), not large's.
    fields = policy(thrifty={"key": "sk-thrifty", "budget": {"usd": 0.002}})
    fakes = upstreams(hosted=CUT)
    outcome = make_calls(tmp_path, fakes, {"body": chat(model="checked"), "key": "sk-thrifty"}, policy_fields=fields)
    (reply,) = outcome.replies
    assert isinstance(reply, JsonReply) and content(reply) == "Half an ans"
    assert reply.headers["x-gateway-escalation-stopped"] == "budget"
    assert fakes["backup"].sent == [] and [e["model"] for e in outcome.events] == ["small"]


def test_a_streamed_request_on_a_checked_route_is_checked_whole_then_replayed(tmp_path: Path) -> None:
    fakes = upstreams(hosted=CUT, backup=answer("A whole answer."))

    async def scenario(gw: FakeGateway) -> bytes:
        reply = await gw.call(chat(model="checked", stream=True))
        assert isinstance(reply, StreamReply)
        return b"".join([chunk async for chunk in reply.chunks])

    fields = copy.deepcopy(BASE_POLICY)
    fields["routes"]["checked"]["streaming"] = "buffer"
    streamed = with_gateway(tmp_path, fakes, scenario, fields)
    whole = completion_from_stream(streamed.split(b"\n\n"))
    assert whole is not None and whole["choices"][0]["message"]["content"] == "A whole answer."
    assert streamed.endswith(b"data: [DONE]\n\n")
    assert all("stream" not in b for b in fakes["hosted"].bodies + fakes["backup"].bodies), "asked for whole answers"
