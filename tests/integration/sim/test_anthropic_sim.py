"""The Anthropic simulator over a real socket, driven by the real anthropic SDK: what a
client of the Messages API notices (auth, versions, cache writes then reads, the stream's
event sequence, limits, 429/529 and the Admin API reports)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from gateway.sim.anthropic import AnthropicSimConfig, AnthropicSimulator, create_anthropic_app
from tests.support.servers import run_asgi_in_thread

# A dev dependency (requirements.lock); a venv made before it was added skips, saying so.
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (pip install -r requirements.lock)")

MODEL = "claude-haiku-4-5"
LONG_SYSTEM = "You are a careful assistant for the accounts team. " * 250  # well over 1024 tokens


@pytest.fixture
def start_sim() -> Iterator[Callable[..., tuple[str, AnthropicSimulator]]]:
    with contextlib.ExitStack() as stack:
        def start(**fields: Any) -> tuple[str, AnthropicSimulator]:
            app = create_anthropic_app(AnthropicSimConfig(**fields))
            return stack.enter_context(run_asgi_in_thread(app)), app

        yield start


def client(url: str, key: str = "sk-ant-test", **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, **kw)


def test_a_plain_message_comes_back_with_usage(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, app = start_sim()
    message = client(url).messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Hi"}],
                                          metadata={"user_id": "u-1"})
    assert message.type == "message" and message.role == "assistant" and message.stop_reason == "end_turn"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.usage.output_tokens == 20 and message.usage.input_tokens > 0
    assert message.usage.cache_read_input_tokens == 0 and message.usage.cache_creation_input_tokens == 0
    assert app.stats.last_version and app.stats.last_version >= "2023-06-01"


def test_auth_and_version_errors_raise_the_sdks_own_classes(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, _ = start_sim(api_keys=["sk-ant-good"])
    with pytest.raises(anthropic.AuthenticationError) as bad_key:
        client(url, "sk-ant-wrong").messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert bad_key.value.body == {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"},
                                  "request_id": bad_key.value.request_id}
    with pytest.raises(anthropic.NotFoundError):
        client(url, "sk-ant-good").messages.create(model="claude-nope", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client(url, "sk-ant-good").messages.create(model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "x"}])
    plain = httpx.post(url + "/v1/messages", headers={"x-api-key": "sk-ant-good"},
                       json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]})
    assert plain.status_code == 400
    assert plain.json()["error"] == {"type": "invalid_request_error", "message": "anthropic-version: header is required"}


def _cached_call(c: anthropic.Anthropic, ttl: str = "5m", question: str = "What is due?") -> Any:
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral", "ttl": ttl}}]
    return c.messages.create(model=MODEL, max_tokens=32, system=system,  # type: ignore[arg-type]
                             messages=[{"role": "user", "content": question}]).usage


def test_a_cached_prefix_is_written_once_then_read(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, _ = start_sim()
    c = client(url)
    first = _cached_call(c)
    assert first.cache_creation_input_tokens > 1024 and first.cache_read_input_tokens == 0
    assert first.cache_creation.ephemeral_5m_input_tokens == first.cache_creation_input_tokens
    second = _cached_call(c, question="And what is overdue?")
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert second.cache_creation_input_tokens == 0
    # Another key is another organisation's cache: nothing to read.
    other = _cached_call(client(url, "sk-ant-other"))
    assert other.cache_read_input_tokens == 0 and other.cache_creation_input_tokens == first.cache_creation_input_tokens


def test_one_hour_writes_are_reported_apart(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, _ = start_sim()
    usage = _cached_call(client(url), ttl="1h")
    assert usage.cache_creation.ephemeral_1h_input_tokens == usage.cache_creation_input_tokens > 0
    assert usage.cache_creation.ephemeral_5m_input_tokens == 0


def test_a_short_prefix_is_not_cached_and_is_no_error(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, _ = start_sim()
    system = [{"type": "text", "text": "Short.", "cache_control": {"type": "ephemeral"}}]
    usage = client(url).messages.create(model=MODEL, max_tokens=8, system=system,  # type: ignore[arg-type]
                                        messages=[{"role": "user", "content": "x"}]).usage
    assert usage.cache_creation_input_tokens == 0 and usage.cache_read_input_tokens == 0


def test_count_tokens_counts_what_a_call_is_billed(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, _ = start_sim()
    c = client(url)
    kwargs: dict[str, Any] = {"model": MODEL, "system": LONG_SYSTEM, "messages": [{"role": "user", "content": "Hello"}]}
    counted = c.messages.count_tokens(**kwargs).input_tokens
    assert c.messages.create(max_tokens=8, **kwargs).usage.input_tokens == counted


def test_the_stream_has_anthropics_event_sequence(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, _ = start_sim()
    with client(url).messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Hi"}]) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == 20 and final.stop_reason == "end_turn" and final.content[0].type == "text"
    # The SDK drops pings; the wire has them.
    body = {"model": MODEL, "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    wire = httpx.post(url + "/v1/messages", json=body, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    events = [line.removeprefix("event: ") for line in wire.text.splitlines() if line.startswith("event: ")]
    assert events == ["message_start", "content_block_start", "ping", *["content_block_delta"] * 20,
                      "content_block_stop", "message_delta", "message_stop"]


def test_tools_thinking_and_stop_sequences(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, _ = start_sim()
    c = client(url)
    tools: Any = [{"name": "get_invoice", "description": "Look an invoice up",
                   "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}]
    asked = c.messages.create(model=MODEL, max_tokens=2048, tools=tools, thinking={"type": "enabled", "budget_tokens": 1024},
                              messages=[{"role": "user", "content": "Find invoice 7"}])
    assert [b.type for b in asked.content] == ["thinking", "tool_use"] and asked.stop_reason == "tool_use"
    call = asked.content[1]
    assert call.type == "tool_use" and call.name == "get_invoice" and isinstance(call.input, dict) and "id" in call.input
    with c.messages.stream(model=MODEL, max_tokens=256, tools=tools,
                           messages=[{"role": "user", "content": "Find invoice 7"}]) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].type == "tool_use" and isinstance(streamed.content[0].input, dict)
    answered = c.messages.create(model=MODEL, max_tokens=256, tools=tools, messages=[
        {"role": "user", "content": "Find invoice 7"},
        {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "paid"}]},
    ])
    assert answered.stop_reason == "end_turn" and answered.content[0].type == "text"
    text = answered.content[0].text
    stopped = c.messages.create(model=MODEL, max_tokens=256, stop_sequences=[text[5:8]], tools=tools, messages=[
        {"role": "user", "content": "Find invoice 7"},
        {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "paid"}]},
    ])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == text[5:8]
    assert stopped.content[0].type == "text" and text[5:8] not in stopped.content[0].text


def test_rate_limits_429_and_529(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, app = start_sim(rpm=1)
    c = client(url)
    raw = c.messages.with_raw_response.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert raw.headers["anthropic-ratelimit-requests-limit"] == "1"
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert raw.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    with pytest.raises(anthropic.RateLimitError) as limited:
        c.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert int(limited.value.response.headers["retry-after"]) >= 1
    app.config.rpm, app.config.fail_529_rate = 4000, 1.0
    with pytest.raises(anthropic.InternalServerError) as overloaded:
        c.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert overloaded.value.status_code == 529 and overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    app.config.fail_529_rate, app.config.spend_limited = 0.0, True
    with pytest.raises(anthropic.RateLimitError) as broke:
        c.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert "retry-after" not in broke.value.response.headers


def test_usage_and_cost_reports_match_what_was_billed(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, app = start_sim()
    c = client(url)
    first, second = _cached_call(c), _cached_call(c, question="Again?")
    admin = {"x-api-key": "sk-ant-admin01-test", "anthropic-version": "2023-06-01"}
    params: Any = {"starting_at": "2020-01-01T00:00:00Z", "bucket_width": "1d", "group_by[]": ["model", "api_key_id"],
                   "limit": 31}
    assert httpx.get(url + "/v1/organizations/usage_report/messages", params=params,
                     headers={"x-api-key": "sk-ant-test"}).status_code == 401
    results: list[dict[str, Any]] = []
    page: dict[str, Any] = {"has_more": True, "next_page": None}
    while page["has_more"]:
        query = {**params, **({"page": page["next_page"]} if page["next_page"] else {})}
        page = httpx.get(url + "/v1/organizations/usage_report/messages", params=query, headers=admin).json()
        results += [r for bucket in page["data"] for r in bucket["results"]]
    assert len(results) == 1
    row = results[0]
    assert row["model"] == MODEL and row["api_key_id"].startswith("apikey_")
    assert row["uncached_input_tokens"] == first.input_tokens + second.input_tokens
    assert row["cache_read_input_tokens"] == second.cache_read_input_tokens
    assert row["cache_creation"]["ephemeral_5m_input_tokens"] == first.cache_creation_input_tokens
    assert row["output_tokens"] == first.output_tokens + second.output_tokens
    cost_params: Any = {"starting_at": "2020-01-01T00:00:00Z", "group_by[]": ["description"], "limit": 31}
    cents = Decimal(0)
    page = {"has_more": True, "next_page": None}
    while page["has_more"]:
        query = {**cost_params, **({"page": page["next_page"]} if page["next_page"] else {})}
        page = httpx.get(url + "/v1/organizations/cost_report", params=query, headers=admin).json()
        cents += sum((Decimal(r["amount"]) for b in page["data"] for r in b["results"]), Decimal(0))
    price = app.config.prices[MODEL]
    expected = (row["uncached_input_tokens"] * price.input + row["cache_read_input_tokens"] * price.cache_read
                + row["cache_creation"]["ephemeral_5m_input_tokens"] * price.cache_write_5m
                + row["output_tokens"] * price.output) * 100 / 1_000_000
    assert cents == expected


def test_an_injected_call_is_billed_in_both_reports(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, app = start_sim()
    admin = {"x-api-key": "sk-ant-admin01-test", "anthropic-version": "2023-06-01"}
    injected = {"model": MODEL, "api_key_id": "apikey_unseen", "uncached_input_tokens": 100, "cache_read_input_tokens": 0,
                "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 1000}, "output_tokens": 10}
    assert httpx.post(url + "/sim/usage/inject", json={**injected, "output_tokens": -1}).status_code == 400
    assert httpx.post(url + "/sim/usage/inject", json={"model": MODEL}).status_code == 400
    assert httpx.post(url + "/sim/usage/inject", json=injected).status_code == 200
    window: Any = {"starting_at": "2020-01-01T00:00:00Z", "limit": 31}
    usage = []
    page: dict[str, Any] = {"has_more": True, "next_page": None}
    while page["has_more"]:
        query = {**window, "group_by[]": ["model", "api_key_id"], **({"page": page["next_page"]} if page["next_page"] else {})}
        page = httpx.get(url + "/v1/organizations/usage_report/messages", params=query, headers=admin).json()
        usage += [r for bucket in page["data"] for r in bucket["results"]]
    [row] = usage
    assert (row["api_key_id"], row["cache_creation"]["ephemeral_1h_input_tokens"], row["output_tokens"]) == ("apikey_unseen", 1000, 10)
    price = app.config.prices[MODEL]
    [billed] = app.state.usage.records
    assert billed.cache_write_1h == 1000 and price.cache_write_1h == 2 * price.input  # 1-hour writes at their own rate


def test_system_turns_mid_conversation_need_their_beta(start_sim: Callable[..., tuple[str, AnthropicSimulator]]) -> None:
    url, _ = start_sim()
    turns: Any = [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be brief."}]
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.role"):
        client(url).messages.create(model=MODEL, max_tokens=8, messages=turns)
    beta = client(url, default_headers={"anthropic-beta": "claude-code-20250219,mid-conversation-system-2026-04-07"})
    assert beta.messages.create(model=MODEL, max_tokens=8, messages=turns).type == "message"
