"""What a tenant hears when the upstream fails: what happened, in OpenAI's shape, without
the upstream's internal URLs, hosts or keys."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.conftest import sim_config
from tests.support.stack import UPSTREAM_KEY, Stack, running_stack

HELLO: Any = [{"role": "user", "content": "hello"}]
INTERNAL = (f"upstream connect error: POST http://10.0.3.7:8000/v1/chat/completions via gpu-3.pool.internal:8443 "
            f"(Authorization: Bearer {UPSTREAM_KEY}; fallback key sk-live-0123456789abcdef) reset by peer")
LEAKS = ("10.0.3.7", "8000", "gpu-3", "pool.internal", "8443", UPSTREAM_KEY, "sk-live", "/v1/chat/completions")


def edit(text: str) -> str:
    return text.replace("defaults:\n", "defaults:\n  retry: {max_attempts: 2, base_s: 0.01, cap_s: 0.02}\n", 1)


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
