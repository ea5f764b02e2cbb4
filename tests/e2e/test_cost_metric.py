"""`gateway_cost_usd_total` is the ledger's spend as Prometheus sees it: per tenant and
model, equal to what the admin API books for the same calls."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import ADMIN_KEY, Stack

HELLO: Any = [{"role": "user", "content": "hello there"}]


def cost_series(text: str) -> dict[tuple[str, str], Decimal]:
    return {(s.labels["tenant"], s.labels["model"]): Decimal(repr(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples if s.name == "gateway_cost_usd_total"}


def test_the_cost_counter_equals_the_ledger_per_tenant_and_model(stack: Stack) -> None:
    acme = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
    globex = openai.OpenAI(base_url=stack.gateway, api_key=stack.other_key, max_retries=0)
    for i in range(3):
        acme.chat.completions.create(model="sim-large", messages=HELLO, max_tokens=40 + i)
        globex.chat.completions.create(model="gpt-4o-mini", messages=HELLO, max_tokens=30 + i)
    acme.chat.completions.create(model="pool-model", messages=HELLO, max_tokens=25)
    rows = httpx.get(f"{stack.root}/admin/costs", params={"group_by": "tenant,model"},
                     headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=20).json()["rows"]
    # The stack is this module's own: its ledger and its counters began together.
    counted = cost_series(stack.metrics())  # the admin read flushed the books, and with them the metrics
    for tenant, model in (("acme", "sim-large"), ("globex", "gpt-4o-mini"), ("acme", "pool-model")):
        booked = next(Decimal(r["cost_usd"]) for r in rows if (r["tenant"], r["model"]) == (tenant, model))
        assert booked > 0
        assert abs(counted[(tenant, model)] - booked) < Decimal("1e-12"), (tenant, model, counted, booked)
