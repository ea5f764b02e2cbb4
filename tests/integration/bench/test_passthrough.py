"""The benchmark's floor proxy forwards faithfully: the openai SDK gets through it what
it gets from the simulator directly - the answer, the stream, the key's refusal."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import openai
import pytest

from bench.passthrough import Passthrough
from gateway.sim.hosted import HostedSimConfig, create_hosted_app
from tests.support.servers import run_asgi_in_thread

MESSAGES = [{"role": "user", "content": "Say something short."}]


@pytest.fixture
def urls() -> Iterator[tuple[str, str]]:
    """(simulator, passthrough in front of it), both on real loopback ports."""
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(run_asgi_in_thread(create_hosted_app(HostedSimConfig(require_auth=True, seed=7))))
        proxy = stack.enter_context(run_asgi_in_thread(Passthrough(sim)))
        yield sim, proxy


def client(root: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=root + "/v1", api_key="sk-sim", max_retries=0)


def test_a_whole_answer_comes_through_as_the_simulator_gave_it(urls: tuple[str, str]) -> None:
    sim, proxy = urls
    through = client(proxy).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=12)
    direct = client(sim).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=12)
    assert through.choices[0].message.content
    assert through.usage == direct.usage
    assert through.choices[0].message.content == direct.choices[0].message.content


def test_a_stream_comes_through_event_by_event(urls: tuple[str, str]) -> None:
    _, proxy = urls
    chunks = list(client(proxy).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=12,
                                                          stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_the_upstream_sees_the_client_key_or_its_absence(urls: tuple[str, str]) -> None:
    """The simulator refuses a call with no key; through the proxy, it is the same call."""
    _, proxy = urls
    body = {"model": "gpt-4o-mini", "messages": MESSAGES}
    refused = httpx.post(proxy + "/v1/chat/completions", json=body)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.post(proxy + "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-sim"}).status_code == 200
