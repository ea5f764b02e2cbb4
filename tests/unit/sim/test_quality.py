"""Quality profiles: fixed per prompt, rates that hold, failures `gateway.verify` catches,
silent mistakes it cannot, and the truth kept for benchmarks."""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from typing import Any

import httpx
import orjson
import pytest

from gateway.sim.cli import add_sim_commands
from gateway.sim.generation import GenerationSettings
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from gateway.sim.quality import Outcome, QualityProfile, parse_profile, plan_chat_with_quality
from gateway.sim.runtime_config import patch_config
from gateway.verify import Check, Verifier

SETTINGS = GenerationSettings(seed=7, default_tokens=20)
CHEAP = QualityProfile(0.25, 0.01)
CONTACT = {"type": "object", "properties": {
    "name": {"type": "string"}, "email": {"type": "string", "format": "email"}, "age": {"type": "integer"},
}, "required": ["name", "email", "age"], "additionalProperties": False}
LOOKUP = {"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object", "properties": {
    "order_id": {"type": "string"}, "include_items": {"type": "boolean"},
}, "required": ["order_id", "include_items"]}}}
SHAPES: dict[str, dict[str, Any]] = {
    "extraction": {"response_format": {"type": "json_schema", "json_schema": {"name": "contact", "schema": CONTACT}}},
    "json_object": {"response_format": {"type": "json_object"}},
    "tools": {"tools": [LOOKUP]},
    "text": {"max_tokens": 200},
}
CHECKS = [Check(s) for s in ("invalid_json", "schema_mismatch", "truncated", "invalid_tool_call", "empty")]
# json_object answers carry the simulator's generic {"answer", "score"}.
REQUIRED = {"extraction": ("name", "email", "age"), "json_object": ("answer",), "tools": ("name",), "text": ("name",)}


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"task number {i}: do the thing"}]


def outcome(i: int, model: str = "cheap", profile: QualityProfile = CHEAP, **body: Any) -> Outcome:
    _, truth = plan_chat_with_quality({"messages": messages(i), **body}, SETTINGS, model, profile)
    return truth.outcome


def test_rates_hold_over_distinct_prompts() -> None:
    counts = Counter(outcome(i) for i in range(2000))
    assert counts[Outcome.CHECK_FAIL] / 2000 == pytest.approx(0.25, abs=0.03)
    assert counts[Outcome.SILENT_WRONG] / 2000 == pytest.approx(0.01, abs=0.008)
    assert outcome(1, profile=QualityProfile(0.0, 0.0)) is Outcome.CORRECT
    assert {outcome(i, profile=QualityProfile(1.0, 0.0)) for i in range(50)} == {Outcome.CHECK_FAIL}


def test_same_prompt_same_outcome_and_answer() -> None:
    body = {"messages": messages(3), **SHAPES["extraction"]}
    first = [plan_chat_with_quality(body, SETTINGS, "cheap", CHEAP) for _ in range(3)]
    assert all(plans == first[0][0] and truth == first[0][1] for plans, truth in first)
    assert [outcome(i) for i in range(200)] == [outcome(i) for i in range(200)]


def test_draws_are_independent_per_model() -> None:
    profile = QualityProfile(0.25, 0.0)
    pairs = [(outcome(i, "small", profile), outcome(i, "large", profile)) for i in range(2000)]
    both = sum(a is Outcome.CHECK_FAIL and b is Outcome.CHECK_FAIL for a, b in pairs) / 2000
    assert both == pytest.approx(0.25 * 0.25, abs=0.02)
    assert pairs != [(a, a) for a, _ in pairs]


def test_the_seed_changes_which_prompts_are_hard() -> None:
    other = GenerationSettings(seed=8, default_tokens=20)
    a = [plan_chat_with_quality({"messages": messages(i)}, SETTINGS, "m", CHEAP)[1].outcome for i in range(300)]
    b = [plan_chat_with_quality({"messages": messages(i)}, other, "m", CHEAP)[1].outcome for i in range(300)]
    assert a != b


async def _exchange(app: Any, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
        reply = await client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        response = reply.json()
        truth = await client.get(f"/sim/truth/{response['id']}")
        assert truth.status_code == 200
        return response, truth.json()


def _run_shape(shape: str, count: int, profile: QualityProfile) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    app = create_hosted_app(HostedSimConfig(models=["cheap"], quality={"cheap": profile}))

    async def run_all() -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
        out = []
        for i in range(count):
            body = {"model": "cheap", "messages": messages(i), **SHAPES[shape]}
            response, truth = await _exchange(app, body)
            out.append((body, response, truth))
        return out

    return asyncio.run(run_all())


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_check_failures_are_caught_and_silent_mistakes_are_not(shape: str) -> None:
    verifier = Verifier()
    ways: Counter[str] = Counter()
    for body, response, truth in _run_shape(shape, 120, QualityProfile(0.5, 0.25)):
        failures = verifier.check([*CHECKS, Check("missing_fields", REQUIRED[shape])], body, response, {})
        assert truth["model"] == "cheap" and truth["id"] == response["id"]
        if truth["outcome"] == "check_fail":
            assert truth["signal"] in {f.signal for f in failures}, (truth, failures)
            ways[truth["signal"]] += 1
        else:
            assert failures == [], (truth, failures, response["choices"][0])
        ways[truth["outcome"]] += 1
    assert ways["check_fail"] and ways["silent_wrong"] and ways["correct"]
    expected = {"extraction": {"invalid_json", "schema_mismatch"}, "json_object": {"invalid_json"},
                "tools": {"invalid_tool_call"}, "text": {"truncated", "empty"}}[shape]
    assert expected <= set(ways)


def test_silent_wrong_answers_differ_from_the_right_one() -> None:
    body = {"messages": messages(0), **SHAPES["extraction"]}
    right, _ = plan_chat_with_quality(body, SETTINGS, "m", QualityProfile(0.0, 0.0))
    wrong, truth = plan_chat_with_quality(body, SETTINGS, "m", QualityProfile(0.0, 1.0))
    assert truth.outcome is Outcome.SILENT_WRONG and right[0].text != wrong[0].text
    assert set(orjson.loads(wrong[0].text)) == {"name", "email", "age"}


def test_tool_failures_break_the_arguments() -> None:
    for i in range(80):
        plans, truth = plan_chat_with_quality({"messages": messages(i), "tools": [LOOKUP]}, SETTINGS, "m", QualityProfile(1.0, 0.0))
        assert plans[0].tool_call is not None and plans[0].finish_reason == "tool_calls"
        if truth.detail == "cut-off JSON text":
            with pytest.raises(orjson.JSONDecodeError):
                orjson.loads(plans[0].text)
        else:
            assert len(orjson.loads(plans[0].text)) == 1, truth


def test_every_choice_shares_the_prompt_outcome() -> None:
    plans, truth = plan_chat_with_quality({"messages": messages(5), "n": 3}, SETTINGS, "m", QualityProfile(1.0, 0.0))
    assert truth.signal in {"truncated", "empty"}
    assert len({(p.finish_reason, p.completion_tokens > 0) for p in plans}) == 1


def test_models_without_a_profile_are_right_unless_cut_off() -> None:
    app = create_hosted_app(HostedSimConfig(models=["cheap", "strong"], quality={"cheap": QualityProfile(1.0, 0.0)}))
    _, truth = asyncio.run(_exchange(app, {"model": "strong", "messages": messages(1)}))
    assert truth["outcome"] == "correct" and truth["signal"] is None
    _, cut = asyncio.run(_exchange(app, {"model": "strong", "messages": messages(1), "max_tokens": 3}))
    assert (cut["outcome"], cut["signal"]) == ("check_fail", "truncated")


def test_streamed_answers_have_a_truth_too() -> None:
    app = create_hosted_app(HostedSimConfig(models=["cheap"], quality={"cheap": QualityProfile(0.0, 1.0)}))

    async def stream() -> tuple[int, Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
            reply = await client.post("/v1/chat/completions", json={"model": "cheap", "messages": messages(2), "stream": True})
            first = reply.text.split("\n\n")[0].removeprefix("data: ")
            truth = await client.get(f"/sim/truth/{orjson.loads(first)['id']}")
            return truth.status_code, truth.json()

    status, truth = asyncio.run(stream())
    assert status == 200 and truth["outcome"] == "silent_wrong"


def test_unknown_ids_are_404_and_reset_forgets() -> None:
    app = create_hosted_app(HostedSimConfig(models=["cheap"]))

    async def run() -> tuple[int, int, int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
            missing = (await client.get("/sim/truth/chatcmpl-nope")).status_code
            response = (await client.post("/v1/chat/completions", json={"model": "cheap", "messages": messages(0)})).json()
            known = (await client.get(f"/sim/truth/{response['id']}")).status_code
            await client.post("/sim/reset")
            return missing, known, (await client.get(f"/sim/truth/{response['id']}")).status_code

    assert asyncio.run(run()) == (404, 200, 404)


def test_parse_profile() -> None:
    assert parse_profile("cheap=0.25,0.01") == ("cheap", QualityProfile(0.25, 0.01))
    assert parse_profile("org/model=v1=0,0.5") == ("org/model=v1", QualityProfile(0.0, 0.5))
    for bad in ("cheap", "cheap=0.2", "cheap=a,b", "=0.1,0.1", "cheap=0.8,0.3", "cheap=-0.1,0"):
        with pytest.raises(ValueError):
            parse_profile(bad)


def test_cli_flag_and_runtime_config() -> None:
    parser = argparse.ArgumentParser()
    add_sim_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sim", "hosted", "--quality-profile", "cheap=0.25,0.01", "--quality-profile", "strong=0,0.01"])
    assert dict(args.quality_profile) == {"cheap": QualityProfile(0.25, 0.01), "strong": QualityProfile(0.0, 0.01)}
    with pytest.raises(SystemExit):
        parser.parse_args(["sim", "hosted", "--quality-profile", "cheap=2,0"])
    config = HostedSimConfig()
    patch_config(config, {"quality": {"cheap": {"check_fail_rate": 0.5, "silent_wrong_rate": 0}}})
    assert config.quality == {"cheap": QualityProfile(0.5, 0.0)}
    assert config.to_json()["quality"] == {"cheap": {"check_fail_rate": 0.5, "silent_wrong_rate": 0.0}}
