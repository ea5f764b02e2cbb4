"""The hosted simulator over real sockets, through the real openai SDK where possible."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from gateway.tokens.counting import count_chat_tokens
from tests.integration.sim.conftest import RunningHosted

HELLO: list[Any] = [{"role": "user", "content": "Say hello"}]
AUTH = {"authorization": "Bearer sk-test-key"}
WEATHER_TOOL: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}


def sdk(sim: RunningHosted, key: str = "sk-test-key") -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url + "/v1", api_key=key, max_retries=0, timeout=10)


def sse_payloads(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]


def test_chat_shape_usage_and_request_id(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted()
    raw = sdk(sim).chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=HELLO)
    reply = raw.parse()
    assert raw.headers["x-request-id"].startswith("req_")
    assert reply.id.startswith("chatcmpl-") and reply.object == "chat.completion" and reply.system_fingerprint
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content
    usage = reply.usage
    assert usage is not None
    assert usage.prompt_tokens == count_chat_tokens(HELLO)
    assert usage.completion_tokens == 20 and usage.total_tokens == usage.prompt_tokens + 20
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details is not None and usage.completion_tokens_details.reasoning_tokens == 0
    again = sdk(sim).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert again.choices[0].message.content == reply.choices[0].message.content, "same seed and prompt, same answer"


def test_stream_matches_non_stream_and_usage_chunk_only_when_asked(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted()
    client = sdk(sim)
    whole = client.chat.completions.create(model="sim-small", messages=HELLO)
    plain = list(client.chat.completions.create(model="sim-small", messages=HELLO, stream=True))
    assert plain[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in plain) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in plain if c.choices[0].finish_reason] == ["stop"]
    assert all(c.usage is None for c in plain)
    with_usage = list(client.chat.completions.create(
        model="sim-small", messages=HELLO, stream=True, stream_options={"include_usage": True}))
    assert with_usage[-1].choices == [] and with_usage[-1].usage is not None
    assert with_usage[-1].usage.completion_tokens == 20
    raw = httpx.post(f"{sim.url}/v1/chat/completions", headers=AUTH, json={
        "model": "sim-small", "messages": HELLO, "stream": True, "stream_options": {"include_usage": True}})
    assert raw.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(raw.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1]), "earlier chunks carry usage: null"


def test_stream_is_flushed_chunk_by_chunk(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(token_delay_s=0.1, output_tokens=6)
    arrivals: list[float] = []
    start = time.monotonic()
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", headers=AUTH, timeout=10,
                      json={"model": "sim-small", "messages": HELLO, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content":" ' in line:
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 6
    assert arrivals[-1] - arrivals[0] >= 0.4, "tokens must arrive spread out, not in one flush"


def test_n_stop_and_length(start_hosted: Callable[..., RunningHosted]) -> None:
    client = sdk(start_hosted())
    three = client.chat.completions.create(model="sim-small", messages=HELLO, n=3)
    texts = [c.message.content for c in three.choices]
    assert [c.index for c in three.choices] == [0, 1, 2] and len(set(texts)) == 3
    assert three.usage is not None and three.usage.completion_tokens == 60
    word = (texts[0] or "").split()[3]
    stopped = client.chat.completions.create(model="sim-small", messages=HELLO, stop=[" " + word])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == (texts[0] or "").split(" " + word)[0]
    capped = client.chat.completions.create(model="sim-small", messages=HELLO, max_completion_tokens=4)
    assert capped.choices[0].finish_reason == "length" and capped.usage is not None and capped.usage.completion_tokens == 4
    forced = client.chat.completions.create(model="sim-small", messages=HELLO, max_tokens=40, extra_body={"ignore_eos": True})
    assert forced.usage is not None and forced.usage.completion_tokens == 40


def test_tool_call_then_text_after_tool_result(start_hosted: Callable[..., RunningHosted]) -> None:
    client = sdk(start_hosted())
    first = client.chat.completions.create(model="gpt-4o-mini", messages=HELLO, tools=[WEATHER_TOOL])
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.content is None
    call = message.tool_calls[0]  # type: ignore[index]
    assert call.id.startswith("call_") and call.function.name == "get_weather"  # type: ignore[union-attr]
    args = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert isinstance(args["city"], str) and isinstance(args["days"], int)
    follow_up = [*HELLO, message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "21C"}]
    second = client.chat.completions.create(model="gpt-4o-mini", messages=follow_up, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


def test_streamed_tool_call_reassembles(start_hosted: Callable[..., RunningHosted]) -> None:
    client = sdk(start_hosted())
    stream = client.chat.completions.create(model="gpt-4o-mini", messages=HELLO, tools=[WEATHER_TOOL], stream=True,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    name, arguments, finish = "", "", None
    for chunk in stream:
        for delta_call in chunk.choices[0].delta.tool_calls or []:
            name += (delta_call.function and delta_call.function.name) or ""
            arguments += (delta_call.function and delta_call.function.arguments) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert name == "get_weather" and finish == "tool_calls"
    assert set(json.loads(arguments)) == {"city", "days"}


def test_json_modes(start_hosted: Callable[..., RunningHosted]) -> None:
    client = sdk(start_hosted())
    obj = client.chat.completions.create(model="gpt-4o-mini", messages=HELLO, response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "tags"], "additionalProperties": False}
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=HELLO, response_format={
        "type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}})
    data = json.loads(reply.choices[0].message.content or "")
    assert isinstance(data["name"], str) and all(isinstance(t, str) for t in data["tags"])


def test_errors_in_openai_shape(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(require_auth=True)
    no_key = httpx.post(f"{sim.url}/v1/chat/completions", json={"model": "sim-small", "messages": HELLO})
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as missing:
        sdk(sim).chat.completions.create(model="gpt-9", messages=HELLO)
    assert missing.value.code == "model_not_found"
    assert "The model `gpt-9` does not exist" in missing.value.message
    broken = httpx.post(f"{sim.url}/v1/chat/completions", headers=AUTH, content=b'{"model": "sim-small", "messages": [')
    assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk(sim).chat.completions.create(model="sim-small", messages=[])
    assert bad.value.param == "messages"
    stats = httpx.get(f"{sim.url}/sim/stats").json()
    assert stats["by_status"] == {"401": 1, "404": 1, "400": 2}
    assert stats["last_authorization"] == "Bearer sk-test-key"


def test_extra_fields_are_accepted_and_recorded(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted()
    sdk(sim, "sk-upstream").chat.completions.create(model="sim-small", messages=HELLO, extra_body={"my_field": {"x": 1}},
                                                    extra_headers={"x-trace": "abc"})
    stats = httpx.get(f"{sim.url}/sim/stats").json()
    assert stats["last_body"]["my_field"] == {"x": 1}
    assert stats["last_authorization"] == "Bearer sk-upstream" and stats["last_headers"]["x-trace"] == "abc"


def test_embeddings_base64_and_float_agree(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted()
    reply = sdk(sim).embeddings.create(model="text-embedding-3-small", input=["alpha", "beta"])  # SDK asks for base64
    assert httpx.get(f"{sim.url}/sim/stats").json()["last_body"]["encoding_format"] == "base64"
    assert len(reply.data) == 2 and len(reply.data[0].embedding) == 64
    assert reply.data[0].embedding != reply.data[1].embedding
    assert reply.usage.prompt_tokens == 2
    floats = httpx.post(f"{sim.url}/v1/embeddings", headers=AUTH, json={"model": "text-embedding-3-small", "input": "alpha"}).json()
    assert floats["data"][0]["embedding"] == pytest.approx(reply.data[0].embedding, abs=1e-6)
    short = sdk(sim).embeddings.create(model="text-embedding-3-small", input="alpha", dimensions=8)
    assert len(short.data[0].embedding) == 8


def test_legacy_completions(start_hosted: Callable[..., RunningHosted]) -> None:
    client = sdk(start_hosted())
    reply = client.completions.create(model="sim-small", prompt=["one", "two"], max_tokens=5)
    assert reply.object == "text_completion" and [c.index for c in reply.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert reply.usage is not None and reply.usage.completion_tokens == 10
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="sim-small", prompt="one", max_tokens=5, stream=True)
                       if c.choices)
    assert streamed == reply.choices[0].text


def test_automatic_prompt_caching(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted()
    client = sdk(sim)
    long_system = {"role": "system", "content": "You are a careful assistant. " * 300}
    messages: Any = [long_system, *HELLO]

    def cached(**extra: Any) -> int:
        usage = client.chat.completions.create(model="gpt-4o-mini", messages=messages, **extra).usage
        assert usage is not None and usage.prompt_tokens_details is not None and usage.prompt_tokens >= 1024
        return usage.prompt_tokens_details.cached_tokens or 0

    assert cached() == 0
    hit = cached()
    assert hit >= 1024 and hit % 128 == 0
    assert cached(prompt_cache_key="tenant-a") == 0, "a different cache key is a different cache"
    assert cached(prompt_cache_key="tenant-a") == hit
    httpx.post(f"{sim.url}/sim/config", json={"prompt_caching": False}).raise_for_status()
    assert cached() == 0


def test_models_and_runtime_config(start_hosted: Callable[..., RunningHosted]) -> None:
    sim = start_hosted(models=["a-model", "b-model"])
    assert [m.id for m in sdk(sim).models.list()] == ["a-model", "b-model"]
    assert httpx.get(f"{sim.url}/health").json() == {"status": "ok"}  # what worker health checks ask
    assert httpx.post(f"{sim.url}/sim/config", json={"no_such_field": 1}).status_code == 400
    assert httpx.post(f"{sim.url}/sim/config", json={"rpm": "many"}).status_code == 400
    assert httpx.post(f"{sim.url}/sim/config", json={"rpm": 5, "output_tokens": 3}).json()["rpm"] == 5
    assert sim.app.config.output_tokens == 3
    reply = sdk(sim).chat.completions.create(model="a-model", messages=HELLO)
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    httpx.post(f"{sim.url}/sim/reset").raise_for_status()
    assert httpx.get(f"{sim.url}/sim/stats").json()["requests"] == 0
