"""The response cache's decisions, on the in-memory store: which requests it serves
and stores, under whose scope, and that only complete answers are kept."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import orjson

from gateway.caching.response_cache import BYPASS, MISS, ResponseCache
from gateway.caching.store import MemoryStore
from gateway.routing.loader import parse_policy
from gateway.routing.resolved import RuntimePolicy
from gateway.types.cache import CachedAnswer
from tests.fakes.gateway import BASE_POLICY, SECRET, chat, policy

DETERMINISTIC = chat("What is 2 + 2?", temperature=0)
ANSWER = {"object": "chat.completion", "model": "small-v1",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 12, "completion_tokens": 1}}


def runtime(fields: dict[str, Any]) -> RuntimePolicy:
    return RuntimePolicy(parse_policy(orjson.dumps(fields).decode()))


SHARED = runtime(policy(beta={"key": "sk-beta"}, gamma={"key": "sk-gamma", "cache": {"group": "team"}},
                        delta={"key": "sk-delta", "cache": {"group": "team"}}))


def store_then_look_up(policy: RuntimePolicy, saver: str, reader: str, body: dict[str, Any] = DETERMINISTIC,
                       answer: dict[str, Any] = ANSWER) -> CachedAnswer | None:
    cache = ResponseCache(MemoryStore(1024 * 1024), SECRET)
    target = policy.targets["small"]

    async def run() -> CachedAnswer | None:
        plan = cache.plan("chat.completions", saver, target, body, policy, "")
        await cache.save(plan, target, answer, orjson.dumps(answer))
        return await cache.lookup(cache.plan("chat.completions", reader, target, body, policy, ""))

    return asyncio.run(run())


def test_a_deterministic_answer_is_served_back_byte_for_byte_with_its_usage() -> None:
    found = store_then_look_up(SHARED, "acme", "acme")
    assert found is not None and orjson.loads(found.body) == ANSWER
    assert (found.model, found.upstream, found.usage) == ("small", "hosted", ANSWER["usage"])


def test_tenants_never_see_each_others_answers_unless_they_share_a_group() -> None:
    assert store_then_look_up(SHARED, "acme", "beta") is None
    assert store_then_look_up(SHARED, "gamma", "delta") is not None
    assert store_then_look_up(SHARED, "acme", "gamma") is None


def test_an_answer_cut_short_is_not_stored() -> None:
    cut = copy.deepcopy(ANSWER)
    cut["choices"][0]["finish_reason"] = "length"
    assert store_then_look_up(SHARED, "acme", "acme", answer=cut) is None


def test_a_different_request_misses() -> None:
    cache = ResponseCache(MemoryStore(1024), SECRET)
    target = SHARED.targets["small"]
    one = cache.plan("chat.completions", "acme", target, DETERMINISTIC, SHARED, "")
    other = cache.plan("chat.completions", "acme", target, chat("What is 3 + 3?", temperature=0), SHARED, "")
    assert one.status == other.status == MISS and one.key != other.key


def test_sampled_requests_bypass_the_cache_unless_opted_in() -> None:
    cache = ResponseCache(MemoryStore(1024), SECRET)
    target = SHARED.targets["small"]
    assert cache.plan("chat.completions", "acme", target, chat(temperature=0.7), SHARED, "").status == BYPASS
    fields = copy.deepcopy(BASE_POLICY)
    fields["models"]["small"]["cache"] = True
    opted = runtime(fields)
    assert cache.plan("chat.completions", "acme", opted.targets["small"], chat(temperature=0.7), opted, "").status == MISS


def test_cache_control_turns_the_lookup_or_the_store_off() -> None:
    cache = ResponseCache(MemoryStore(1024), SECRET)
    target = SHARED.targets["small"]
    no_cache = cache.plan("chat.completions", "acme", target, DETERMINISTIC, SHARED, "no-cache")
    no_store = cache.plan("chat.completions", "acme", target, DETERMINISTIC, SHARED, "no-store")
    both = cache.plan("chat.completions", "acme", target, DETERMINISTIC, SHARED, "no-cache, no-store")
    assert (no_cache.lookup, no_cache.store) == (False, True)
    assert (no_store.lookup, no_store.store) == (True, False)
    assert both.status == BYPASS


def test_a_tenant_or_model_that_opts_out_bypasses_it() -> None:
    fields = policy(private={"key": "sk-private", "cache": {"enabled": False}})
    fields["models"]["large"]["cache"] = False
    opted_out = runtime(fields)
    cache = ResponseCache(MemoryStore(1024), SECRET)
    assert cache.plan("chat.completions", "private", opted_out.targets["small"], DETERMINISTIC, opted_out, "").status == BYPASS
    assert cache.plan("chat.completions", "acme", opted_out.targets["large"], DETERMINISTIC, opted_out, "").status == BYPASS
