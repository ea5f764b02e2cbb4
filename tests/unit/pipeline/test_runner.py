"""The runner's stage order and its short-circuits, on fake upstreams: what the client
gets, what reached the upstream, what the ledger holds and books."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.errors import AuthenticationFailed, BudgetExceeded, GatewayError, RateLimited
from gateway.pipeline.runner import JsonReply
from tests.fakes.gateway import FakeGateway, chat, make_calls, pico, policy, upstreams, with_gateway
from tests.fakes.upstream import FakeUpstream, Sent, answer, error, json_reply

LIMITED = policy(limited={"key": "sk-limited", "limits": {"rpm": 1, "max_queue": 0}})
POOR = policy(poor={"key": "sk-poor", "budget": {"usd": 0.000001}})


def test_a_call_is_held_before_it_is_sent_and_booked_at_its_usage(tmp_path: Path) -> None:
    hosted = FakeUpstream("hosted", answer(prompt=12, completion=7))
    held_when_sent: list[list[dict[str, Any]]] = []

    async def scenario(gw: FakeGateway) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
        async def look(_: Sent) -> None:
            held_when_sent.append(await gw.holds())

        hosted.on_call = look
        return await gw.call(chat("Say hello.")), await gw.events(), await gw.holds()

    reply, events, holds = with_gateway(tmp_path, upstreams(hosted=hosted), scenario)
    assert isinstance(reply, JsonReply) and reply.status == 200
    assert orjson.loads(reply.body)["choices"][0]["message"]["content"] == "Hello there."
    assert [h["state"] for h in held_when_sent[0]] == ["reserved"], "the hold is in the ledger before the upstream is called"
    assert hosted.bodies[0]["model"] == "small-v1" and hosted.bodies[0]["max_completion_tokens"] == 100
    cost = pico(12, 7, 1, 2)
    assert reply.headers["x-gateway-cost-usd"] == "0.000026" and reply.headers["x-gateway-model"] == "small"
    assert [(e["status"], e["prompt_tokens"], e["completion_tokens"], e["cost_pico"]) for e in events] == [("ok", 12, 7, cost)]
    assert [(h["state"], h["settled_pico"]) for h in holds] == [("settled", cost)]


def run(tmp_path: Path, fakes: dict[str, FakeUpstream], *calls: dict[str, Any],
        policy_fields: dict[str, Any] | None = None) -> tuple[list[Any], list[dict[str, Any]], list[dict[str, Any]]]:
    outcome = make_calls(tmp_path, fakes, *calls, policy_fields=policy_fields)
    return outcome.replies, outcome.events, outcome.holds


def test_a_wrong_key_is_refused_before_anything_is_held_or_sent(tmp_path: Path) -> None:
    fakes = upstreams()
    (reply,), events, holds = run(tmp_path, fakes, {"key": "sk-nobody"})
    assert isinstance(reply, AuthenticationFailed) and reply.http_status == 401
    assert (events, holds, fakes["hosted"].sent) == ([], [], [])


def test_a_missing_key_is_refused_like_a_wrong_one(tmp_path: Path) -> None:
    fakes = upstreams()
    (reply,), events, holds = run(tmp_path, fakes, {"key": ""})
    assert isinstance(reply, AuthenticationFailed) and "Missing API key" in reply.message
    assert (events, holds, fakes["hosted"].sent) == ([], [], [])


def test_an_admission_refusal_holds_nothing_and_sends_nothing(tmp_path: Path) -> None:
    fakes = upstreams()
    (first, second), events, holds = run(tmp_path, fakes, {"key": "sk-limited"}, {"key": "sk-limited"}, policy_fields=LIMITED)
    assert isinstance(first, JsonReply) and first.status == 200
    assert isinstance(second, RateLimited) and second.http_status == 429
    assert "retry-after" in second.response_headers()
    assert len(fakes["hosted"].sent) == 1 and len(holds) == 1 and len(events) == 1, "only the admitted call"


def test_a_refused_hold_never_reaches_the_upstream(tmp_path: Path) -> None:
    fakes = upstreams()
    (reply,), events, holds = run(tmp_path, fakes, {"key": "sk-poor"}, policy_fields=POOR)
    assert isinstance(reply, BudgetExceeded) and reply.http_status == 429
    assert (events, holds, fakes["hosted"].sent) == ([], [], [])


def test_a_cache_hit_is_neither_admitted_held_nor_sent(tmp_path: Path) -> None:
    fakes = upstreams()
    same = chat("What is 2 + 2?", temperature=0)
    fields = policy(limited={"key": "sk-limited", "limits": {"rpm": 2, "max_queue": 0}})
    replies, events, holds = run(tmp_path, fakes, *({"key": "sk-limited", "body": b} for b in (same, same, chat("Other."),
                                                                                                   chat("Third."))),
                                 policy_fields=fields)
    miss, hit, other, refused = replies
    assert isinstance(miss, JsonReply) and miss.headers["x-gateway-cache"] == "miss"
    assert isinstance(hit, JsonReply) and hit.headers["x-gateway-cache"] == "hit" and hit.body == miss.body
    assert hit.headers["x-gateway-cost-usd"] == "0.000000"
    assert isinstance(other, JsonReply), "the hit took nothing from the tenant's 2 requests a minute"
    assert isinstance(refused, RateLimited)
    assert len(fakes["hosted"].sent) == 2 and len(holds) == 2
    assert sorted((e["kind"], e["cost_pico"]) for e in events) == [("cache_hit", 0), ("model", pico(10, 5, 1, 2)),
                                                                   ("model", pico(10, 5, 1, 2))]


def test_an_upstream_failure_is_booked_and_its_hold_released(tmp_path: Path) -> None:
    fakes = upstreams(hosted=error(400, "bad request", kind="invalid_request_error"))
    (reply,), events, holds = run(tmp_path, fakes, {})
    assert isinstance(reply, GatewayError) and reply.http_status == 400
    assert reply.headers["x-gateway-cost-usd"] == "0.000000"
    assert [(e["status"], e["http_status"], e["cost_pico"]) for e in events] == [("error", 400, 0)]
    assert [(h["state"], h["settled_pico"]) for h in holds] == [("released", 0)]


def test_count_tokens_asks_the_upstream_and_bills_nothing(tmp_path: Path) -> None:
    counted = FakeUpstream("anthropic", json_reply({"input_tokens": 14}), kind="anthropic")
    body = {"model": "claude", "messages": [{"role": "user", "content": "Count me."}]}
    (reply,), events, holds = run(tmp_path, upstreams(anthropic=counted),
                                  {"body": body, "endpoint": "messages.count_tokens", "anthropic_version": "2023-06-01"})
    assert isinstance(reply, JsonReply) and orjson.loads(reply.body) == {"input_tokens": 14}
    assert counted.sent[0].path == "/messages/count_tokens" and counted.sent[0].headers == {"anthropic-version": "2023-06-01"}
    assert (events, holds) == ([], [])


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_nobody_limits_is_still_on_record_before_it_is_sent(tmp_path: Path, stream: bool) -> None:
    fakes = upstreams()
    replies, _, holds = run(tmp_path, fakes, {"body": chat(stream=stream)})
    assert not isinstance(replies[0], GatewayError)
    assert len(holds) == 1 and holds[0]["request_id"] == replies[0].headers["x-request-id"]
