"""Tenant-scoped caches as a user sees them: hits are exact replays, never cross
tenants, respect cache-control and TTLs, and cost nothing upstream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.auth.keys import key_digest
from tests.e2e.conftest import sim_config, sim_stats
from tests.e2e.test_openai_sdk import wait_until
from tests.support.servers import run_asgi_in_thread
from tests.support.stack import ADMIN_KEY, Stack, running_stack

Q = [{"role": "user", "content": "What is the capital of France?"}]


class ToolServer:
    """A tool endpoint that counts its calls and can be told to fail."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.calls += 1
        status, payload = (500, b'{"oops": true}') if self.fail else (200, json.dumps({"echo": json.loads(body or b"{}"), "n": self.calls}).encode())
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})


@pytest.fixture(scope="module")
def tool_server() -> Iterator[tuple[ToolServer, str]]:
    server = ToolServer()
    with run_asgi_in_thread(server) as url:
        yield server, url


@pytest.fixture
def stack(tmp_path: Path, tool_server: tuple[ToolServer, str]) -> Iterator[Stack]:
    def edit(text: str) -> str:
        text = text.replace("  globex:\n", '    cache: {response_ttl_s: 60}\n  globex:\n', 1)
        return text + (f"tools:\n  lookup:\n    url: {tool_server[1]}/lookup\n    ttl_s: 60\n    price_usd: 0.002\n"
                       f"  fresh:\n    url: {tool_server[1]}/fresh\n    cacheable: false\n")
    with running_stack(tmp_path, edit_policy=edit) as running:
        yield running


def raw_chat(stack: Stack, key: str, **extra: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", **extra.pop("headers", {})}
    body = {"model": "gpt-4o-mini", "messages": Q, "temperature": 0, **extra}
    return httpx.post(f"{stack.gateway}/chat/completions", json=body, headers=headers, timeout=20)


def upstream_calls(stack: Stack) -> int:
    return int(sim_stats(stack.hosted)["requests"])  # type: ignore[call-overload]


def test_hit_replays_the_miss_byte_for_byte_and_never_crosses_tenants(stack: Stack) -> None:
    before = upstream_calls(stack)
    miss = raw_chat(stack, stack.key)
    hit = raw_chat(stack, stack.key)
    assert (miss.headers["x-gateway-cache"], hit.headers["x-gateway-cache"]) == ("miss", "hit")
    assert hit.content == miss.content
    assert upstream_calls(stack) == before + 1, "a hit costs nothing upstream"
    assert hit.headers["x-gateway-cost-usd"] == "0.000000"
    other = raw_chat(stack, stack.other_key)  # byte-identical request, another tenant
    assert other.headers["x-gateway-cache"] == "miss"
    assert upstream_calls(stack) == before + 2


def test_streamed_hit_has_the_same_content(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
    messages: Any = [{"role": "user", "content": "Stream me a cached answer"}]
    first = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in first.parse() if c.choices)
    assert first.headers["x-gateway-cache"] == "miss"
    again = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages, temperature=0, stream=True,
                                                             stream_options={"include_usage": True})
    chunks = list(again.parse())
    assert again.headers["x-gateway-cache"] == "hit"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == streamed
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    whole = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages, temperature=0)
    assert whole.headers["x-gateway-cache"] == "hit" and whole.parse().choices[0].message.content == streamed


def test_cache_control_and_nondeterministic_requests(stack: Stack) -> None:
    assert raw_chat(stack, stack.key, headers={"cache-control": "no-store"}).headers["x-gateway-cache"] == "miss"
    assert raw_chat(stack, stack.key).headers["x-gateway-cache"] == "miss", "no-store must not have stored it"
    assert raw_chat(stack, stack.key).headers["x-gateway-cache"] == "hit"
    assert raw_chat(stack, stack.key, headers={"cache-control": "no-cache"}).headers["x-gateway-cache"] == "miss"
    sampled = {"temperature": 0.8}
    assert raw_chat(stack, stack.key, **sampled).headers["x-gateway-cache"] == "bypass"
    assert raw_chat(stack, stack.key, **sampled).headers["x-gateway-cache"] == "bypass"
    assert raw_chat(stack, stack.key, seed=7, temperature=0.8).headers["x-gateway-cache"] == "miss"


def test_errors_and_truncated_answers_are_not_cached(stack: Stack) -> None:
    sim_config(stack.hosted, fail_5xx_rate=1.0)
    failed = raw_chat(stack, stack.key, messages=[{"role": "user", "content": "fail once"}])
    assert failed.status_code == 502
    sim_config(stack.hosted, fail_5xx_rate=0.0)
    assert raw_chat(stack, stack.key, messages=[{"role": "user", "content": "fail once"}]).headers["x-gateway-cache"] == "miss"
    cut = raw_chat(stack, stack.key, messages=[{"role": "user", "content": "truncate me"}], max_tokens=2)
    assert cut.json()["choices"][0]["finish_reason"] == "length"
    again = raw_chat(stack, stack.key, messages=[{"role": "user", "content": "truncate me"}], max_tokens=2)
    assert again.headers["x-gateway-cache"] == "miss"


def test_ttl_expiry(tmp_path: Path) -> None:
    short = lambda t: t.replace("  globex:\n", "    cache: {response_ttl_s: 0.3}\n  globex:\n", 1)  # noqa: E731
    with running_stack(tmp_path, edit_policy=short) as stack:
        assert raw_chat(stack, stack.key).headers["x-gateway-cache"] == "miss"
        assert raw_chat(stack, stack.key).headers["x-gateway-cache"] == "hit"
        wait_until(lambda: raw_chat(stack, stack.key).headers["x-gateway-cache"] == "miss")


def test_vllm_salts_match_within_a_tenant_and_differ_across(stack: Stack) -> None:
    salts = []
    for key in (stack.key, stack.key, stack.other_key):
        httpx.post(f"{stack.gateway}/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=20,
                   json={"model": "pool-model" if key == stack.key else "gpt-4o-mini", "messages": Q})
        if key == stack.key:
            salts.append(sim_stats(stack.vllm)["last_body"]["cache_salt"])  # type: ignore[index]
    assert salts[0] == salts[1]
    # The other tenant may not use the pool in this policy; derive its salt through its prompt_cache_key instead.
    hosted_key = sim_stats(stack.hosted)["last_body"]["prompt_cache_key"]  # type: ignore[index]
    raw_chat(stack, stack.key, seed=1)
    assert sim_stats(stack.hosted)["last_body"]["prompt_cache_key"] != hosted_key  # type: ignore[index]


def test_cache_hits_are_booked_with_their_savings(stack: Stack) -> None:
    raw_chat(stack, stack.key, messages=[{"role": "user", "content": "book my savings"}])
    raw_chat(stack, stack.key, messages=[{"role": "user", "content": "book my savings"}])
    rows = httpx.get(f"{stack.gateway.removesuffix('/v1')}/admin/costs", params={"group_by": "tenant"},
                     headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()["rows"]
    acme = next(r for r in rows if r["tenant"] == "acme")
    assert float(acme["saved_usd"]) > 0


def test_prompt_hygiene_reports_volatile_prefixes(stack: Stack) -> None:
    volatile = [{"role": "system", "content": "Now: 2026-11-29T10:32:07Z. You are helpful."}, {"role": "user", "content": "hi"}]
    httpx.post(f"{stack.gateway}/chat/completions", headers={"authorization": f"Bearer {stack.key}"},
               json={"model": "gpt-4o-mini", "messages": volatile}, timeout=20)
    report = httpx.get(f"{stack.gateway.removesuffix('/v1')}/admin/prompt-hygiene",
                       headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert "acme" in json.dumps(report) and "timestamp" in json.dumps(report)
    metrics = stack.metrics()
    assert 'gateway_prompt_prefix_volatile_total{kind="' in metrics


# -- tool-result cache ----------------------------------------------------------------

def invoke(stack: Stack, key: str, tool: str, arguments: Any, **headers: str) -> httpx.Response:
    return httpx.post(f"{stack.gateway}/tools/{tool}/invoke", json={"arguments": arguments},
                      headers={"authorization": f"Bearer {key}", **headers}, timeout=20)


def test_tool_results_are_cached_per_tenant_and_invalidated(stack: Stack, tool_server: tuple[ToolServer, str]) -> None:
    server, _ = tool_server
    calls = server.calls
    first = invoke(stack, stack.key, "lookup", {"q": "paris", "lang": "en"})
    second = invoke(stack, stack.key, "lookup", {"lang": "en", "q": "paris"})  # same arguments, other order
    assert first.status_code == 200 and first.json()["cached"] is False and second.json()["cached"] is True
    assert second.json()["result"] == first.json()["result"] and server.calls == calls + 1
    assert first.headers["x-gateway-cost-usd"] == "0.002000" and second.headers["x-gateway-cost-usd"] == "0.000000"
    other = invoke(stack, stack.other_key, "lookup", {"q": "paris", "lang": "en"})
    assert other.json()["cached"] is False, "another tenant never gets this tenant's tool result"
    gone = httpx.delete(f"{stack.gateway.removesuffix('/v1')}/admin/tools/lookup/cache", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert gone.status_code == 200
    assert invoke(stack, stack.key, "lookup", {"q": "paris", "lang": "en"}).json()["cached"] is False


def test_tool_version_bump_invalidates(stack: Stack) -> None:
    invoke(stack, stack.key, "lookup", {"q": "rome"})
    assert invoke(stack, stack.key, "lookup", {"q": "rome"}).json()["cached"] is True
    text = stack.policy_path.read_text().replace("    ttl_s: 60\n", "    ttl_s: 60\n    version: '2'\n", 1)
    stack.policy_path.write_text(text)
    wait_until(lambda: invoke(stack, stack.key, "lookup", {"q": "rome"}).json()["version"] == "2")
    assert invoke(stack, stack.key, "lookup", {"q": "rome"}).json()["cached"] is True  # cached again under v2


def test_tool_errors_are_reported_and_not_cached(stack: Stack, tool_server: tuple[ToolServer, str]) -> None:
    server, _ = tool_server
    server.fail = True
    try:
        failed = invoke(stack, stack.key, "lookup", {"q": "err"})
        assert failed.status_code == 502 and "tool `lookup` answered 500" in failed.json()["error"]["message"]
    finally:
        server.fail = False
    assert invoke(stack, stack.key, "lookup", {"q": "err"}).json()["cached"] is False
    assert invoke(stack, stack.key, "fresh", {"q": 1}).json()["cached"] is False
    assert invoke(stack, stack.key, "fresh", {"q": 1}).json()["cached"] is False
    assert invoke(stack, stack.key, "nope", {}).status_code == 404


def test_tool_calls_appear_in_the_task_books(stack: Stack) -> None:
    task = httpx.post(f"{stack.gateway}/tasks", headers={"authorization": f"Bearer {stack.key}"}, json={"budget_usd": "1.00"}).json()
    invoke(stack, stack.key, "lookup", {"q": "task"}, **{"x-task-id": task["id"]})
    books = httpx.get(f"{stack.gateway}/tasks/{task['id']}", headers={"authorization": f"Bearer {stack.key}"}).json()
    [event] = books["events"]
    assert event["kind"] == "tool" and event["cost_usd"] == "0.002000" and "tool_seconds" in event["timeline_ms"]
    assert books["budget"]["settled_usd"] == "0.002000"


def test_digest_helper_is_consistent() -> None:
    assert key_digest("x").startswith("sha256:")
