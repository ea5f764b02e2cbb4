"""The retrier as a client meets it, on fake upstreams: what is retried and after how
long, what the budgets and the deadline stop, when a call fails over, and that every
attempt is booked."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from gateway.errors import AllUpstreamsFailed, InvalidRequest, PoolSpill, RateLimited
from gateway.pipeline.runner import JsonReply
from tests.fakes.gateway import BASE_POLICY, chat, make_calls, pico, policy, upstreams
from tests.fakes.upstream import FakeUpstream, answer, error, raises, rate_limited, timeout, unreachable


def retry_policy(**retry: Any) -> dict[str, Any]:
    fields = copy.deepcopy(BASE_POLICY)
    fields["defaults"]["retry"].update(retry)
    return fields


def test_a_429_is_retried_after_the_delay_the_provider_asked_for(tmp_path: Path) -> None:
    hosted = FakeUpstream("hosted", rate_limited(1.5), answer(prompt=10, completion=5))
    outcome = make_calls(tmp_path, upstreams(hosted=hosted), {})
    (reply,) = outcome.replies
    assert isinstance(reply, JsonReply) and reply.headers["x-gateway-model"] == "small"
    assert outcome.waits == [1.5]
    assert len(hosted.sent) == 2 and hosted.bodies[0] == hosted.bodies[1], "the retry sends the same request"
    assert [(e["status"], e["http_status"], e["cost_pico"]) for e in outcome.events] == [
        ("error", 429, 0), ("ok", 200, pico(10, 5, 1, 2))]
    assert reply.headers["x-gateway-cost-usd"] == "0.000020"


def test_server_errors_back_off_with_jitter_under_a_growing_ceiling(tmp_path: Path) -> None:
    hosted = FakeUpstream("hosted", error(500), error(503), answer())
    outcome = make_calls(tmp_path, upstreams(hosted=hosted), {}, policy_fields=retry_policy(base_s=0.5, cap_s=8))
    assert isinstance(outcome.replies[0], JsonReply)
    first, second = outcome.waits
    assert 0 <= first <= 0.5 and 0 <= second <= 1.0
    assert [e["status"] for e in outcome.events] == ["error", "error", "ok"]


def test_timeouts_and_broken_connections_are_retried(tmp_path: Path) -> None:
    hosted = FakeUpstream("hosted", timeout(), unreachable(), answer())
    outcome = make_calls(tmp_path, upstreams(hosted=hosted), {})
    assert isinstance(outcome.replies[0], JsonReply) and len(hosted.sent) == 3
    assert [e["status"] for e in outcome.events] == ["timeout", "error", "ok"]


def test_a_request_the_upstream_rejects_is_not_retried_nor_failed_over(tmp_path: Path) -> None:
    fakes = upstreams(hosted=error(400, "max_tokens is too large", kind="invalid_request_error"))
    outcome = make_calls(tmp_path, fakes, {})
    (reply,) = outcome.replies
    assert isinstance(reply, InvalidRequest) and reply.http_status == 400 and "max_tokens is too large" in reply.message
    assert len(fakes["hosted"].sent) == 1 and fakes["backup"].sent == [] and outcome.waits == []


def test_a_quota_429_without_retry_after_is_not_retried(tmp_path: Path) -> None:
    fakes = upstreams(hosted=error(429, "You exceeded your current quota", code="insufficient_quota", kind="insufficient_quota"))
    outcome = make_calls(tmp_path, fakes, {})
    assert isinstance(outcome.replies[0], RateLimited)
    assert len(fakes["hosted"].sent) == 1 and fakes["backup"].sent == []


def test_a_failing_upstream_fails_over_to_the_models_fallback(tmp_path: Path) -> None:
    fakes = upstreams(hosted=error(500), backup=answer(prompt=10, completion=5))
    outcome = make_calls(tmp_path, fakes, {"key": "sk-rich"}, policy_fields=policy(rich={"key": "sk-rich", "budget": {"usd": 10}}))
    (reply,) = outcome.replies
    assert isinstance(reply, JsonReply) and reply.headers["x-gateway-model"] == "spare"
    assert len(fakes["hosted"].sent) == 3 and [b["model"] for b in fakes["backup"].bodies] == ["spare"]
    # the fallback is dearer: its worst case was held before it was tried
    assert len(outcome.holds) == 2
    assert [e["model"] for e in outcome.events] == ["small", "small", "small", "spare"]
    assert sum(h["settled_pico"] for h in outcome.holds) == pico(10, 5, 3, 6), "only the answer cost anything"


def test_when_every_target_fails_the_client_hears_of_each(tmp_path: Path) -> None:
    fakes = upstreams(hosted=error(500, "hosted broke"), backup=error(502, "backup broke"))
    outcome = make_calls(tmp_path, fakes, {}, policy_fields=retry_policy(max_attempts=1))
    (reply,) = outcome.replies
    assert isinstance(reply, AllUpstreamsFailed) and reply.http_status == 502
    assert "hosted broke" in reply.message and "backup broke" in reply.message
    assert [(h["state"], h["settled_pico"]) for h in outcome.holds] == [("released", 0)]


def test_a_wait_past_the_deadline_is_not_taken_the_call_fails_over(tmp_path: Path) -> None:
    fakes = upstreams(hosted=rate_limited(30))
    outcome = make_calls(tmp_path, fakes, {"x_request_timeout": "5"})
    (reply,) = outcome.replies
    assert isinstance(reply, JsonReply) and reply.headers["x-gateway-model"] == "spare"
    assert outcome.waits == [] and len(fakes["hosted"].sent) == 1


def test_with_no_fallback_a_wait_past_the_deadline_ends_the_call_at_once(tmp_path: Path) -> None:
    fakes = upstreams(backup=rate_limited(30))
    outcome = make_calls(tmp_path, fakes, {"body": chat(model="large"), "x_request_timeout": "5"})
    (reply,) = outcome.replies
    assert isinstance(reply, RateLimited) and reply.response_headers()["retry-after-ms"] == "30000"
    assert outcome.waits == [] and len(fakes["backup"].sent) == 1


def test_the_retry_budget_caps_retries_across_requests(tmp_path: Path) -> None:
    """Ratio 0: only the budget's slack of three retries a minute, shared by the
    upstream's requests - then a failing upstream sees each request once."""
    fakes = upstreams(hosted=error(500))
    outcome = make_calls(tmp_path, fakes, {}, {}, {}, policy_fields=retry_policy(budget_ratio=0))
    assert all(isinstance(r, JsonReply) and r.headers["x-gateway-model"] == "spare" for r in outcome.replies)
    per_request: dict[str, int] = {}
    for event in outcome.events:
        if event["model"] == "small":
            per_request[event["request_id"]] = per_request.get(event["request_id"], 0) + 1
    assert list(per_request.values()) == [3, 2, 1]


def test_a_pool_that_cannot_take_the_call_spills_to_the_fallback_without_retrying(tmp_path: Path) -> None:
    fakes = upstreams(hosted=raises(PoolSpill("saturated", "every replica is full")))
    outcome = make_calls(tmp_path, fakes, {})
    (reply,) = outcome.replies
    assert isinstance(reply, JsonReply) and reply.headers["x-gateway-model"] == "spare"
    assert reply.headers["x-gateway-spill"] == "saturated"
    assert len(fakes["hosted"].sent) == 1 and outcome.waits == []
    assert [e["status"] for e in outcome.events] == ["spilled", "ok"]


def test_retries_never_make_a_gateway_error_escape_unbooked(tmp_path: Path) -> None:
    fakes = upstreams(hosted=timeout(), backup=timeout())
    outcome = make_calls(tmp_path, fakes, {}, policy_fields=retry_policy(max_attempts=2))
    assert isinstance(outcome.replies[0], AllUpstreamsFailed)
    assert [e["status"] for e in outcome.events] == ["timeout"] * 4
