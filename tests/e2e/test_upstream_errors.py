"""What a tenant hears when the upstream fails: what happened, in OpenAI's shape, without
the upstream's internal URLs, hosts or keys; and a model the upstream does not serve is
a 404 the SDK does not retry, not an outage."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.conftest import sim_config, sim_stats
from tests.support.stack import UPSTREAM_KEY, Stack, running_stack

HELLO: Any = [{"role": "user", "content": "hello"}]
INTERNAL = (f"upstream connect error: POST http://10.0.3.7:8000/v1/chat/completions via gpu-3.pool.internal:8443 "
            f"(Authorization: Bearer {UPSTREAM_KEY}; fallback key sk-live-0123456789abcdef) reset by peer")
LEAKS = ("10.0.3.7", "8000", "gpu-3", "pool.internal", "8443", UPSTREAM_KEY, "sk-live", "/v1/chat/completions")
# A model whose upstream id has a typo: the upstream answers 404 model_not_found.
MISNAMED = """\
  misnamed:
    upstream: hosted
    upstream_model: gpt-4o-mimi
    price: {input: 0.15, output: 0.60}
"""


def edit(text: str) -> str:
    quick = "defaults:\n  retry: {max_attempts: 2, base_s: 0.01, cap_s: 0.02}\n"
    return text.replace("defaults:\n", quick, 1).replace("tenants:\n", MISNAMED + "tenants:\n", 1)


@pytest.fixture(scope="module")
def errors_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("errors"), edit_policy=edit) as stack:
        yield stack


def sdk(stack: Stack, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.gateway, api_key=stack.key, **options)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_upstream_error_reaches_the_tenant_without_urls_hosts_or_keys(errors_stack: Stack, stream: bool) -> None:
    sim_config(errors_stack.hosted, fail_5xx_rate=1.0, server_error_message=INTERNAL)
    try:
        with pytest.raises(openai.InternalServerError) as raised:
            sdk(errors_stack, max_retries=0).chat.completions.create(model="gpt-4o-mini", messages=HELLO, stream=stream)
    finally:
        sim_config(errors_stack.hosted, fail_5xx_rate=0.0, server_error_message=None)
    message = raised.value.message
    assert "upstream connect error" in message and "reset by peer" in message, "what happened is still said"
    assert "[redacted url]" in message and "[redacted host]" in message and "[redacted]" in message
    for leaked in LEAKS:
        assert leaked not in message and leaked not in raised.value.response.text, leaked


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_model_the_upstream_does_not_serve_is_a_404_tried_once(errors_stack: Stack, stream: bool) -> None:
    before: Any = sim_stats(errors_stack.hosted)["requests"]
    with pytest.raises(openai.NotFoundError) as raised:  # the SDK's default retries are on: it must not use them
        sdk(errors_stack).chat.completions.create(model="misnamed", messages=HELLO, stream=stream)
    assert sim_stats(errors_stack.hosted)["requests"] == before + 1, "neither the gateway nor the SDK retried"
    error = raised.value
    assert error.status_code == 404 and error.code == "model_not_found" and error.type == "invalid_request_error"
    assert "`misnamed`" in error.message and "gpt-4o-mimi" not in error.response.text, "the client's name, not the upstream's"
    assert error.response.headers["x-should-retry"] == "false" and error.response.headers["x-request-id"]


def test_a_misnamed_model_does_not_cool_its_upstream_down(errors_stack: Stack) -> None:
    client = sdk(errors_stack, max_retries=0)
    for _ in range(8):  # more than the 5 consecutive failures that cool an upstream down
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="misnamed", messages=HELLO)
    reply = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=HELLO)
    assert reply.headers["x-gateway-upstream"] == "hosted" and reply.parse().choices[0].message.content


def test_an_unknown_model_in_the_policy_is_the_same_404(errors_stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        sdk(errors_stack, max_retries=0).chat.completions.create(model="gpt-4o-mimi", messages=HELLO)
    assert raised.value.code == "model_not_found" and raised.value.response.headers["x-should-retry"] == "false"
