"""What the gateway's operational endpoints show to whoever can reach them: /metrics
names tenants only to a scraper with the metrics key, and /readyz says which component
is not ready without showing any path or address."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import METRICS_KEY, Stack, running_stack

HELLO: Any = [{"role": "user", "content": "hello"}]


def answer_one_call_per_tenant(stack: Stack) -> None:
    for key in (stack.key, stack.other_key):
        openai.OpenAI(base_url=stack.gateway, api_key=key, max_retries=0).chat.completions.create(
            model="gpt-4o-mini", messages=HELLO)


def answered(text: str) -> float:
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "gateway_requests_total" and s.labels.get("status") == "ok")


def test_metrics_without_the_key_are_refused_and_with_it_name_tenants(stack: Stack) -> None:
    answer_one_call_per_tenant(stack)
    for authorization in (None, "Bearer wrong-key", f"Basic {METRICS_KEY}", f"Bearer {METRICS_KEY}x"):
        headers = {"authorization": authorization} if authorization else {}
        refused = httpx.get(f"{stack.root}/metrics", headers=headers)
        assert refused.status_code == 401, authorization
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert "acme" not in refused.text and "gateway_requests" not in refused.text
    text = stack.metrics()
    assert 'tenant="acme"' in text and 'tenant="globex"' in text


def test_metrics_without_a_key_configured_show_totals_and_no_tenant(tmp_path: Path) -> None:
    with running_stack(tmp_path, metrics_key=None) as stack:
        answer_one_call_per_tenant(stack)
        for authorization in ({}, {"authorization": "Bearer anything"}):
            scraped = httpx.get(f"{stack.root}/metrics", headers=authorization)
            assert scraped.status_code == 200
            text = scraped.text
            assert "tenant" not in text and "acme" not in text and "globex" not in text
            assert answered(text) == 2, "both tenants' calls, summed"
            assert "process_resident_memory_bytes" in text
