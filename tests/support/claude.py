"""A running stack with the Anthropic simulator as a `kind: anthropic` upstream beside
the hosted (OpenAI) and vLLM simulators, for the tests that reach it with the anthropic
and openai SDKs; and the price formula those tests hold the books to."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson

from gateway.accounting.price_sources import installed_litellm_price_map
from gateway.sim.anthropic import AnthropicSimConfig, AnthropicSimulator, create_anthropic_app
from tests.support.servers import run_asgi_in_thread
from tests.support.stack import Stack, running_stack

UPSTREAM_KEY = "sk-ant-upstream-7f3a"
PRICE = {"input": Decimal("0.80"), "cached_input": Decimal("0.08"), "cache_write": Decimal("1.00"), "output": Decimal("4.00")}
UPSTREAM_MODEL = "claude-haiku-4-5"


def litellm_one_hour_rate(model: str = UPSTREAM_MODEL) -> Decimal:
    """litellm's price for a 1-hour cache write of `model`, USD per 1M tokens: what the
    policy's price, which names none, falls back to."""
    found = installed_litellm_price_map()
    assert found is not None, "litellm's bundled price map is not installed"
    per_token = orjson.loads(found[0].read_bytes())[model]["cache_creation_input_token_cost_above_1hr"]
    return (Decimal(str(per_token)) * 1_000_000).normalize()


# The hosted simulator's gpt-4o-mini, as the stack's policy prices it.
GPT_PRICE = {"input": Decimal("0.15"), "cached_input": Decimal("0.075"), "output": Decimal("0.60")}


@dataclass
class ClaudeStack:
    stack: Stack
    sim: AnthropicSimulator
    sim_url: str

    def client(self, key: str | None = None, **options: Any) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.stack.root, api_key=key or self.stack.key, max_retries=0, **options)

    def openai_client(self, **options: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.stack.gateway, api_key=self.stack.key, max_retries=0, **options)

    def hosted_usage(self) -> list[dict[str, Any]]:
        """What the hosted (OpenAI) simulator billed, call by call."""
        records: list[dict[str, Any]] = httpx.get(f"{self.stack.hosted}/sim/usage", timeout=5).json()["data"]
        return records

    def hosted_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = httpx.get(f"{self.stack.hosted}/sim/stats", timeout=5).json()
        return stats

    def open_task(self, budget_usd: str = "1.00") -> str:
        """A task for the tenant's key, so a test can read the books of its calls."""
        response = httpx.post(f"{self.stack.gateway}/tasks", json={"budget_usd": budget_usd}, timeout=10,
                              headers={"authorization": f"Bearer {self.stack.key}"})
        response.raise_for_status()
        task_id: str = response.json()["id"]
        return task_id

    def task_events(self, task_id: str) -> list[dict[str, Any]]:
        """The task's ledger rows, one per attempt."""
        response = httpx.get(f"{self.stack.gateway}/tasks/{task_id}", timeout=10,
                             headers={"authorization": f"Bearer {self.stack.key}"})
        response.raise_for_status()
        events: list[dict[str, Any]] = response.json()["events"]
        return events


def add_claude(sim_url: str, models: str = "", price: dict[str, Decimal] | None = None,
               max_body_bytes: int | None = None) -> Callable[[str], str]:
    """The stack's policy plus the Anthropic upstream, `claude-small` on it, and `models`
    (more YAML under `models:`, indented four spaces per field)."""
    def edit(text: str) -> str:
        if max_body_bytes is not None:
            text = text.replace("max_body_bytes: 65536", f"max_body_bytes: {max_body_bytes}", 1)
        text = text.replace("upstreams:\n", f"upstreams:\n  claude: {{kind: anthropic, base_url: \"{sim_url}\", "
                                             "api_key_env: GATEWAY_TEST_ANTHROPIC_KEY}\n", 1)
        rates = ", ".join(f"{k}: {v}" for k, v in (price or PRICE).items())
        text = text.replace("models:\n", "models:\n  claude-small:\n    upstream: claude\n    upstream_model: claude-haiku-4-5\n"
                            f"    price: {{{rates}}}\n{models}", 1)
        # globex may use Claude, with a budget too small for any call.
        return text.replace("    models: [gpt-4o-mini]\n", "    models: [gpt-4o-mini, claude-small]\n"
                            "    budget: {usd: \"0.000001\", period: total}\n", 1)
    return edit


@contextlib.contextmanager
def running_claude_stack(tmp: Path, config: AnthropicSimConfig | None = None, models: str = "",
                         price: dict[str, Decimal] | None = None, max_body_bytes: int | None = None,
                         **stack_options: Any) -> Iterator[ClaudeStack]:
    os.environ["GATEWAY_TEST_ANTHROPIC_KEY"] = UPSTREAM_KEY
    sim = create_anthropic_app(config or AnthropicSimConfig(api_keys=[UPSTREAM_KEY]))
    with run_asgi_in_thread(sim) as sim_url, \
            running_stack(tmp, edit_policy=add_claude(sim_url, models, price, max_body_bytes), **stack_options) as stack:
        yield ClaudeStack(stack, sim, sim_url)


def formula(record: Any, price: dict[str, Decimal] | None = None) -> Decimal:
    """What the Anthropic simulator billed for one call, at the model's prices in the policy."""
    rates = price or PRICE
    write_1h = rates["cache_write_1h"] if "cache_write_1h" in rates else litellm_one_hour_rate()
    return (record.uncached_input * rates["input"] + record.cache_read * rates["cached_input"]
            + record.cache_write_5m * rates["cache_write"] + record.cache_write_1h * write_1h
            + record.output * rates["output"]) / 1_000_000


def gpt_formula(record: dict[str, Any]) -> Decimal:
    """What the hosted simulator billed for one call of gpt-4o-mini, at the policy's prices."""
    cached = int(record["cached_tokens"])
    return ((int(record["input_tokens"]) - cached) * GPT_PRICE["input"] + cached * GPT_PRICE["cached_input"]
            + int(record["output_tokens"]) * GPT_PRICE["output"]) / 1_000_000
