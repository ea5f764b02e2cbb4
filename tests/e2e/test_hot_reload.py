"""Editing the policy file changes what the running gateway serves; a bad edit is
rejected and the last good policy keeps serving."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import openai

from gateway.auth.keys import key_digest
from tests.support.policies import alias_bomb
from tests.support.stack import Stack


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the gateway did not pick up the edit in time"
        time.sleep(0.02)


def models(stack: Stack) -> set[str]:
    c = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
    return {m.id for m in c.models.list()}


def reload_count(stack: Stack, result: str) -> float:
    text = stack.metrics()
    for line in text.splitlines():
        if line.startswith(f'gateway_policy_reloads_total{{result="{result}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_good_edit_goes_live_and_bad_edit_is_rejected(fresh_stack: Stack) -> None:
    stack = fresh_stack
    original = stack.policy_path.read_text()
    added = original.replace("tenants:", "  gpt-4o:\n    upstream: hosted\n    price: {input: 2.5, output: 10}\ntenants:", 1)
    stack.policy_path.write_text(added)
    eventually(lambda: "gpt-4o" in models(stack))

    stack.policy_path.write_text(added.replace("upstream: hosted\n    price: {input: 2.5", "upstream: nowhere\n    price: {input: 2.5"))
    eventually(lambda: reload_count(stack, "rejected") >= 1)
    assert "gpt-4o" in models(stack), "the last good policy must keep serving"
    ready = httpx.get(stack.gateway.removesuffix("/v1") + "/readyz").json()
    assert "rejected" in ready["checks"]["policy"]["detail"]

    # Revoking a key takes effect on the next request.
    stack.policy_path.write_text(original.replace(key_digest(stack.key), "sha256:" + "0" * 64))
    eventually(lambda: _rejected(stack))


def _rejected(stack: Stack) -> bool:
    try:
        models(stack)
    except openai.AuthenticationError:
        return True
    return False


def test_an_alias_bomb_on_reload_is_refused_while_requests_go_on(fresh_stack: Stack) -> None:
    stack = fresh_stack
    original = stack.policy_path.read_text()
    stack.policy_path.write_text(original + "routes:\n" + "".join(f"  {line}\n" for line in alias_bomb(9).splitlines()))
    eventually(lambda: reload_count(stack, "rejected") >= 1)
    assert "gpt-4o-mini" in models(stack), "the last good policy must keep serving"
    ready = httpx.get(stack.gateway.removesuffix("/v1") + "/readyz").json()
    assert "rejected" in ready["checks"]["policy"]["detail"]
    answer = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "still there?"}], max_tokens=5)
    assert answer.choices[0].message.content
