"""Holds sized from the prompt's free bound never cost a request that fits: when a budget shrinks under a running gateway, the next request is
held at its counted size and still goes through; the one after that is refused. That is
for a provider known to count with the gateway's tokenizer; for any other, a request is
held at its bound for any tokenizer, and refused when that does not fit."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, create_engine, text

from gateway.tokens.counting import count_chat_tokens
from tests.e2e.test_hot_reload import reload_count
from tests.e2e.test_openai_sdk import wait_until
from tests.support.stack import Stack, running_stack

MAX_TOKENS = 40
MESSAGES = [{"role": "user", "content": "Name three rivers that flow through Europe, with one fact each. " * 20}]
INPUT_PICO, OUTPUT_PICO = 150_000, 600_000  # gpt-4o-mini in the test policy, per token


def with_budget(text: str) -> str:
    text = text.replace("defaults:\n", "defaults:\n  prompt_margin_ratio: 0\n  prompt_margin_tokens: 0\n", 1)
    return text.replace("  acme:\n", '  acme:\n    budget: {usd: "1000.00", period: month}\n', 1)


def counted_like_the_simulator(text: str) -> str:
    """The simulator counts prompts with tiktoken's o200k_base, as OpenAI does for gpt-4o-mini."""
    return with_budget(text).replace("  gpt-4o-mini:\n", "  gpt-4o-mini:\n    tokenizer: o200k_base\n    provider_tokenizer: tiktoken\n", 1)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path, edit_policy=counted_like_the_simulator) as running:
        yield running


def ask(stack: Stack) -> httpx.Response:
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    return httpx.post(f"{stack.gateway}/chat/completions", json=body, headers={"authorization": f"Bearer {stack.key}"}, timeout=30)


def test_a_budget_cut_to_one_more_request_still_admits_it(stack: Stack) -> None:
    first = ask(stack)
    assert first.status_code == 200, first.text
    spent = Decimal(first.headers["x-gateway-cost-usd"])
    worst_case = Decimal(count_chat_tokens(MESSAGES) * INPUT_PICO + MAX_TOKENS * OUTPUT_PICO).scaleb(-12)
    # The prompt's byte bound is several times its token count: a hold sized from it would not fit.
    assert len(MESSAGES[0]["content"]) > 3 * count_chat_tokens(MESSAGES)

    engine = create_engine(f"sqlite:///{stack.var_dir / 'ledger.db'}")
    wait_until(lambda: open_holds(engine) == 0)  # the first call is booked

    before = reload_count(stack, "ok")
    stack.policy_path.write_text(stack.policy_path.read_text().replace('usd: "1000.00"', f'usd: "{spent + worst_case}"'))
    wait_until(lambda: reload_count(stack, "ok") > before)

    second = ask(stack)
    assert second.status_code == 200, second.text
    third = ask(stack)
    assert third.status_code == 429 and third.json()["error"]["code"] == "insufficient_quota", third.text
    engine.dispose()


def test_a_provider_with_an_unknown_tokenizer_is_held_at_the_bound_and_refused_when_it_does_not_fit(tmp_path: Path) -> None:
    with running_stack(tmp_path, edit_policy=with_budget) as stack:  # gpt-4o-mini's tokenizer is not declared
        first = ask(stack)
        assert first.status_code == 200, first.text
        spent = Decimal(first.headers["x-gateway-cost-usd"])
        worst_case = Decimal(count_chat_tokens(MESSAGES) * INPUT_PICO + MAX_TOKENS * OUTPUT_PICO).scaleb(-12)
        engine = create_engine(f"sqlite:///{stack.var_dir / 'ledger.db'}")
        wait_until(lambda: open_holds(engine) == 0)  # the first call is booked

        before = reload_count(stack, "ok")
        stack.policy_path.write_text(stack.policy_path.read_text().replace('usd: "1000.00"', f'usd: "{spent + worst_case}"'))
        wait_until(lambda: reload_count(stack, "ok") > before)

        # Its tiktoken count would fit, but another tokenizer may count more: no guess.
        second = ask(stack)
        assert second.status_code == 429 and second.json()["error"]["code"] == "insufficient_quota", second.text
        assert second.headers["x-should-retry"] == "false"
        engine.dispose()


def open_holds(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM reservations WHERE state = 'reserved'")).scalar_one())
