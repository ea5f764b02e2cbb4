"""The real openai SDK, sync and async, against a gateway on a real port in front of
the simulators: what an application sees after changing only its base URL."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import sim_config, sim_stats
from tests.support.stack import UPSTREAM_KEY, Stack

HELLO = [{"role": "user", "content": "Say hello to the gateway"}]


def client(stack: Stack, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.gateway, api_key=key or stack.key, max_retries=0, timeout=20)


def test_chat_non_streaming(stack: Stack) -> None:
    raw = client(stack).chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert raw.headers["x-request-id"].startswith("req_")
    assert raw.headers["x-gateway-model"] == "gpt-4o-mini"
    assert raw.headers["x-gateway-upstream"] == "hosted"


def test_chat_streaming_matches_non_streaming_and_hides_usage_unless_asked(stack: Stack) -> None:
    c = client(stack)
    whole = c.chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    chunks = list(c.chat.completions.create(model="gpt-4o-mini", messages=HELLO, stream=True))  # type: ignore[arg-type]
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]
    assert all(ch.usage is None for ch in chunks), "client did not ask for usage, so it must not get the usage chunk"
    # ... but the gateway asked for it upstream, so the ledger still learns the real usage.
    assert sim_stats(stack.hosted)["last_body"]["stream_options"] == {"include_usage": True}  # type: ignore[index]


def test_chat_streaming_with_usage_when_asked(stack: Stack) -> None:
    chunks = list(client(stack).chat.completions.create(
        model="gpt-4o-mini", messages=HELLO, stream=True, stream_options={"include_usage": True}))  # type: ignore[arg-type]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert chunks[-1].choices == []


def test_tools_round_trip(stack: Stack) -> None:
    tools: list[Any] = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    c = client(stack)
    first = c.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools)
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert "city" in json.loads(call.function.arguments)  # type: ignore[union-attr]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}]
    second = c.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


def test_json_mode_and_schema(stack: Stack) -> None:
    c = client(stack)
    reply = c.chat.completions.create(model="gpt-4o-mini", messages=HELLO, response_format={"type": "json_object"})  # type: ignore[arg-type]
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}
    reply = c.chat.completions.create(model="gpt-4o-mini", messages=HELLO,  # type: ignore[arg-type]
                                      response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    data = json.loads(reply.choices[0].message.content or "")
    assert isinstance(data["name"], str) and isinstance(data["age"], int)


def test_embeddings(stack: Stack) -> None:
    reply = client(stack).embeddings.create(model="text-embedding-3-small", input=["alpha", "beta"])
    assert len(reply.data) == 2 and len(reply.data[0].embedding) > 8
    assert reply.data[0].embedding != reply.data[1].embedding
    assert reply.usage.prompt_tokens > 0


def test_models_list_is_what_this_tenant_may_use(stack: Stack) -> None:
    assert {m.id for m in client(stack).models.list()} == {"gpt-4o-mini", "sim-large", "text-embedding-3-small", "pool-model", "auto"}
    assert [m.id for m in client(stack, stack.other_key).models.list()] == ["gpt-4o-mini"]


def test_models_retrieve_finds_what_the_list_shows_and_nothing_else(stack: Stack) -> None:
    listed = {m.id: m for m in client(stack).models.list()}
    for name in ("gpt-4o-mini", "auto"):
        model = client(stack).models.retrieve(name)
        assert model == listed[name] and (model.id, model.object, model.owned_by) == (name, "model", "gateway")
        assert model.created > 0
    for key, name in ((stack.key, "gpt-4o-mimi"), (stack.other_key, "sim-large"), (stack.key, "org/some-model")):
        with pytest.raises(openai.NotFoundError) as missing:
            client(stack, key).models.retrieve(name)
        assert (missing.value.code, missing.value.type) == ("model_not_found", "invalid_request_error")
        assert f"`{name}`" in missing.value.message
        assert missing.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.AuthenticationError):
        client(stack, "sk-gw-not-a-key").models.retrieve("gpt-4o-mini")


def test_route_answers_with_its_first_model(stack: Stack) -> None:
    raw = client(stack).chat.completions.with_raw_response.create(model="auto", messages=HELLO)  # type: ignore[arg-type]
    assert raw.headers["x-gateway-route"] == "auto" and raw.headers["x-gateway-model"] == "gpt-4o-mini"


def test_vllm_pool_gets_tenant_salt_and_extra_fields_pass_through(stack: Stack) -> None:
    client(stack).chat.completions.create(model="pool-model", messages=HELLO,  # type: ignore[arg-type]
                                          extra_body={"cache_salt": "stolen-salt", "top_k": 5, "my_field": {"x": 1}})
    body: Any = sim_stats(stack.vllm)["last_body"]
    assert body["cache_salt"] != "stolen-salt" and len(body["cache_salt"]) >= 43
    assert body["top_k"] == 5 and body["my_field"] == {"x": 1}
    assert body["model"] == "pool-model"


def test_tenant_key_is_never_forwarded_and_vllm_fields_stay_off_hosted(stack: Stack) -> None:
    client(stack).chat.completions.create(model="gpt-4o-mini", messages=HELLO, extra_body={"cache_salt": "x"})  # type: ignore[arg-type]
    stats: Any = sim_stats(stack.hosted)
    assert stats["last_authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert "cache_salt" not in stats["last_body"]


# -- errors, as the SDK's own exception classes ---------------------------------------

def test_unknown_key_is_authentication_error(stack: Stack) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        client(stack, "sk-gw-not-a-real-key").chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    assert info.value.status_code == 401


def test_unknown_model_and_forbidden_model_are_not_found(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError):
        client(stack).chat.completions.create(model="no-such-model", messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):  # globex may only use gpt-4o-mini
        client(stack, stack.other_key).chat.completions.create(model="sim-large", messages=HELLO)  # type: ignore[arg-type]


def test_invalid_body_is_bad_request(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(stack).chat.completions.create(model="gpt-4o-mini", messages="not a list")  # type: ignore[arg-type]
    assert info.value.code == "invalid_request" and info.value.param == "messages"


def test_malformed_json_is_400_in_openai_shape(stack: Stack) -> None:
    r = httpx.post(f"{stack.gateway}/chat/completions", content=b'{"model": "gpt-4o-mini", "messages": [',
                   headers={"authorization": f"Bearer {stack.key}", "content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json" and r.headers["x-should-retry"] == "false"


def test_body_too_large_is_413(stack: Stack) -> None:
    big = [{"role": "user", "content": "x" * 70_000}]
    with pytest.raises(openai.APIStatusError) as info:
        client(stack).chat.completions.create(model="gpt-4o-mini", messages=big)  # type: ignore[arg-type]
    assert info.value.status_code == 413


def test_upstream_failure_is_502_without_leaking(fresh_stack: Stack) -> None:
    sim_config(fresh_stack.hosted, fail_5xx_rate=1.0)
    with pytest.raises(openai.InternalServerError) as info:
        client(fresh_stack).chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    assert info.value.status_code == 502
    assert UPSTREAM_KEY not in str(info.value.body)
    sim_config(fresh_stack.hosted, fail_5xx_rate=0.0, malformed_rate=1.0)
    with pytest.raises(openai.InternalServerError) as info:
        client(fresh_stack).chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    assert info.value.status_code == 502 and "malformed" in str(info.value.body)


def test_deadline_shorter_than_upstream_is_504_and_pool_aborts(fresh_stack: Stack) -> None:
    sim_config(fresh_stack.vllm, decode_s_per_token=0.5)
    before = int(sim_stats(fresh_stack.vllm)["aborted"])  # type: ignore[call-overload]
    with pytest.raises(openai.InternalServerError) as info:
        client(fresh_stack).chat.completions.create(model="pool-model", messages=HELLO,  # type: ignore[arg-type]
                                                    extra_headers={"x-request-timeout": "0.3"})
    assert info.value.status_code == 504
    wait_until(lambda: int(sim_stats(fresh_stack.vllm)["aborted"]) > before)  # type: ignore[call-overload]


def wait_until(check: Any, timeout_s: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within the deadline")
        time.sleep(0.02)


# -- async client ------------------------------------------------------------------------

def test_async_client_chat_and_stream(stack: Stack) -> None:
    async def go() -> tuple[str, str]:
        c = openai.AsyncOpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
        whole = await c.chat.completions.create(model="pool-model", messages=HELLO)  # type: ignore[arg-type]
        stream = await c.chat.completions.create(model="pool-model", messages=HELLO, stream=True)  # type: ignore[arg-type]
        parts = [ch.choices[0].delta.content or "" async for ch in stream if ch.choices]
        await c.close()
        return whole.choices[0].message.content or "", "".join(parts)

    whole, streamed = asyncio.run(go())
    assert whole and streamed == whole


def test_text_completions(stack: Stack) -> None:
    reply = client(stack).completions.create(model="gpt-4o-mini", prompt="Once upon a time", max_tokens=5)
    assert reply.choices[0].text and reply.usage is not None and reply.usage.completion_tokens <= 5
    streamed = list(client(stack).completions.create(model="gpt-4o-mini", prompt="Once upon a time", max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == reply.choices[0].text


def test_metrics_count_requests_and_tokens(stack: Stack) -> None:
    ok = 'gateway_requests_total{model="gpt-4o-mini",status="ok",tenant="acme"}'

    def answered() -> float:
        text = stack.metrics()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(ok + " "))

    before = answered()
    for _ in range(3):
        client(stack).chat.completions.create(model="gpt-4o-mini", messages=HELLO)  # type: ignore[arg-type]
    assert answered() == before + 3, "a scrape right after the answers counts every one of them"
    list(client(stack).chat.completions.create(model="gpt-4o-mini", messages=HELLO, stream=True))  # type: ignore[arg-type]
    text = stack.metrics()
    assert 'gateway_tokens_total{kind="output",model="gpt-4o-mini",tenant="acme"}' in text
    assert "gateway_time_to_first_token_seconds_bucket" in text and "gateway_upstream_latency_seconds_bucket" in text


def test_health_and_readiness(stack: Stack) -> None:
    root = stack.gateway.removesuffix("/v1")
    assert httpx.get(root + "/healthz").json() == {"status": "ok"}
    probe = httpx.head(root + "/healthz")  # load balancers' probes often use HEAD
    assert probe.status_code == 200 and probe.content == b""
    # The first two are answered before the framework, the last by it.
    for method, path, allowed in (("POST", "/healthz", "GET, HEAD"), ("GET", "/v1/chat/completions", "POST"),
                                  ("POST", "/readyz", "GET")):
        wrong = httpx.request(method, root + path)
        assert wrong.status_code == 405 and wrong.headers["allow"] == allowed
        assert wrong.json()["error"] == {"message": f"{method} is not allowed on {path}", "type": "invalid_request_error",
                                         "param": None, "code": "method_not_allowed"}
    ready = httpx.get(root + "/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["ledger"]["ok"] is True


def test_metrics_count_a_stream_in_flight_until_its_last_event(stack: Stack) -> None:
    def in_flight() -> float:
        text = stack.metrics()
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("gateway_requests_in_flight ")))

    sim_config(stack.hosted, token_delay_s=0.5)  # the rest of the stream is still to come when we look
    try:
        chunks = client(stack).chat.completions.create(model="gpt-4o-mini", messages=HELLO, stream=True,  # type: ignore[arg-type]
                                                       max_tokens=3)
        next(iter(chunks))
        assert in_flight() == 1
        list(chunks)
    finally:
        sim_config(stack.hosted, token_delay_s=0.0)
    deadline = time.monotonic() + 5  # the gateway ends its side just after the client reads [DONE]
    while in_flight() != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert in_flight() == 0
