"""A `kind: anthropic` upstream behind the gateway, reached with the real openai SDK:
the provider key goes out as x-api-key, the answer comes back as a chat completion,
and the cost header is the price formula, exactly (no cache_control is sent on this
path yet, so nothing is cached)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import openai

from gateway.sim.anthropic import AnthropicSimConfig, create_anthropic_app
from tests.support.servers import run_asgi_in_thread
from tests.support.stack import running_stack

LONG_SYSTEM = "You are a careful assistant for the accounts team. " * 250


def test_chat_to_an_anthropic_upstream_costs_exactly_the_formula(tmp_path: Path) -> None:
    sim = create_anthropic_app(AnthropicSimConfig(api_keys=["sk-ant-upstream"]))
    with run_asgi_in_thread(sim) as claude_url:
        def add_claude(text: str) -> str:
            text = text.replace("upstreams:\n", f"upstreams:\n  claude: {{kind: anthropic, base_url: \"{claude_url}\", "
                                                 "api_key_env: GATEWAY_TEST_ANTHROPIC_KEY}\n", 1)
            return text.replace("models:\n", "models:\n  claude-small:\n    upstream: claude\n    upstream_model: claude-haiku-4-5\n"
                                "    price: {input: 0.80, cached_input: 0.08, cache_write: 1.00, output: 4.00}\n", 1)

        import os
        os.environ["GATEWAY_TEST_ANTHROPIC_KEY"] = "sk-ant-upstream"
        with running_stack(tmp_path, edit_policy=add_claude) as stack:
            client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
            costs, usages = [], []
            for question in ("What is due?", "And overdue?"):
                raw = client.chat.completions.with_raw_response.create(
                    model="claude-small", max_tokens=32,
                    messages=[{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": question}])
                reply = raw.parse()
                assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content
                costs.append(Decimal(raw.headers["x-gateway-cost-usd"]))
                usages.append(reply.usage)
            assert sim.stats.last_authorization == "sk-ant-upstream"
            assert stack.key not in str(sim.stats.last_headers)
            assert sim.state.usage.records[0].cache_read == 0  # no cache_control sent: nothing cached
            billed = sim.state.usage.records
            for cost, record in zip(costs, billed, strict=True):
                expected = (record.uncached_input * Decimal("0.80") + record.cache_read * Decimal("0.08")
                            + (record.cache_write_5m + record.cache_write_1h) * Decimal("1.00")
                            + record.output * Decimal("4.00")) / 1_000_000
                assert cost == expected
            assert usages[0] is not None and usages[0].prompt_tokens == billed[0].uncached_input
