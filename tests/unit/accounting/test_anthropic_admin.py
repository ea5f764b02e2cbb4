"""Anthropic's Admin API (usage report + cost report) read into reconciliation rows, and
the admin key chosen for each provider's report APIs."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date
from decimal import Decimal
from typing import Any

import pytest

from gateway.accounting.importers import ProviderSpec, import_provider_rows, parse_provider
from gateway.accounting.importers.anthropic_admin import cents_to_pico, import_anthropic_admin
from gateway.accounting.importers.openai_usage import QueryValue
from gateway.accounting.reconcile import ImportFailed
from gateway.routing.loader import parse_policy

DAY, NEXT, AFTER = date(2026, 5, 1), date(2026, 5, 2), date(2026, 5, 3)
KEY_GW, KEY_OTHER = "apikey_gateway", "apikey_other"
SONNET = "claude-sonnet-4-20250514"


def usage(model: str, key: str, uncached: int, read: int, w5m: int, w1h: int, output: int) -> dict[str, Any]:
    return {"model": model, "api_key_id": key, "workspace_id": None, "service_tier": None, "context_window": None,
            "uncached_input_tokens": uncached, "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": w5m, "ephemeral_1h_input_tokens": w1h},
            "output_tokens": output, "server_tool_use": {"web_search_requests": 0}}


def cost(model: str, token_type: str | None, amount: str, cost_type: str = "tokens") -> dict[str, Any]:
    return {"currency": "USD", "amount": amount, "workspace_id": None, "description": f"{model} {token_type}",
            "cost_type": cost_type, "context_window": "0-200k", "model": model, "service_tier": "standard",
            "token_type": token_type}


def bucket(day: date, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"starting_at": f"{day}T00:00:00Z", "ending_at": "later", "results": results}


class FakeAdminApi:
    """Pages by (report, cursor); records each call's parameters."""

    def __init__(self, pages: Mapping[tuple[str, str | None], dict[str, Any]]) -> None:
        self.pages = pages
        self.calls: list[tuple[str, dict[str, QueryValue]]] = []

    def __call__(self, url: str, params: Mapping[str, QueryValue]) -> dict[str, Any]:
        self.calls.append((url, dict(params)))
        report = "usage" if url.endswith("/usage_report/messages") else "cost"
        page = params.get("page")
        return self.pages[(report, page if isinstance(page, str) else None)]


def two_days_one_key() -> FakeAdminApi:
    return FakeAdminApi({
        ("usage", None): {"data": [bucket(DAY, [usage(SONNET, KEY_GW, 1500, 200, 500, 1000, 500)])],
                          "has_more": True, "next_page": "page_2"},
        ("usage", "page_2"): {"data": [bucket(NEXT, [usage(SONNET, KEY_GW, 10, 0, 0, 0, 4)])], "has_more": False, "next_page": None},
        ("cost", None): {"data": [bucket(DAY, [
            cost(SONNET, "uncached_input_tokens", "0.45"),  # 1500 x $3/M = $0.0045
            cost(SONNET, "cache_read_input_tokens", "0.006"),  # 200 x $0.30/M
            cost(SONNET, "cache_creation.ephemeral_5m_input_tokens", "0.1875"),  # 500 x $3.75/M
            cost(SONNET, "cache_creation.ephemeral_1h_input_tokens", "0.6"),  # 1000 x $6/M
            cost(SONNET, "output_tokens", "0.75")])], "has_more": True, "next_page": "page_2"},
        ("cost", "page_2"): {"data": [bucket(NEXT, [cost(SONNET, "uncached_input_tokens", "0.003"),
                                                   cost(SONNET, "output_tokens", "0.006")])],
                             "has_more": False, "next_page": None},
    })


def test_usage_and_cost_pages_become_rows_to_the_token_and_the_pico_dollar() -> None:
    api = two_days_one_key()
    pages: list[int] = []
    rows, notes = import_anthropic_admin(api, "https://api.anthropic.test/v1", DAY, AFTER, on_progress=lambda n, _: pages.append(n))
    first, second = rows
    # Input as the ledger books it: uncached + cache reads + 5-minute and 1-hour writes.
    assert (first.day, first.model, first.key_id) == (DAY, SONNET, KEY_GW)
    assert (first.input_tokens, first.cached_tokens, first.output_tokens, first.requests) == (3200, 200, 500, None)
    # 1.9935 cents = $0.019935 = 19,935,000,000 pico-dollars, with no float in between.
    assert first.cost_pico == 19_935_000_000
    assert (second.day, second.input_tokens, second.output_tokens, second.cost_pico) == (NEXT, 10, 4, 90_000_000)
    assert notes == [] and pages == [1, 2, 3, 4]
    usage_params, cost_params = api.calls[0][1], api.calls[2][1]
    assert api.calls[0][0] == "https://api.anthropic.test/v1/organizations/usage_report/messages"
    assert (usage_params["bucket_width"], usage_params["group_by[]"]) == ("1d", ["model", "api_key_id"])
    assert usage_params["starting_at"] == "2026-05-01T00:00:00Z" and usage_params["ending_at"] == "2026-05-03T00:00:00Z"
    assert api.calls[1][1]["page"] == "page_2"
    assert api.calls[2][0] == "https://api.anthropic.test/v1/organizations/cost_report"
    assert cost_params["group_by[]"] == ["description"]


def test_cents_become_pico_dollars_exactly() -> None:
    assert cents_to_pico(Decimal("0.0000000001")) == 1  # a ten-billionth of a cent
    assert cents_to_pico(Decimal("123456789.0123456789")) == 1_234_567_890_123_456_789
    assert cents_to_pico(Decimal("0.1")) * 3 == cents_to_pico(Decimal("0.3"))  # what a float gets wrong


def test_a_model_two_keys_used_shares_each_token_types_cost_by_their_tokens() -> None:
    api = FakeAdminApi({
        ("usage", None): {"data": [bucket(DAY, [usage(SONNET, KEY_GW, 1, 0, 0, 0, 2), usage(SONNET, KEY_OTHER, 2, 0, 0, 0, 0)])],
                          "has_more": False, "next_page": None},
        ("cost", None): {"data": [bucket(DAY, [cost(SONNET, "uncached_input_tokens", "0.0009"),
                                               cost(SONNET, "output_tokens", "0.003"),
                                               cost(SONNET, None, "1", cost_type="web_search")])],
                         "has_more": False, "next_page": None},
    })
    rows, notes = import_anthropic_admin(api, "https://api.anthropic.test/v1", DAY, NEXT)
    shares = {r.key_id: r.cost_pico for r in rows}
    # Input: 9,000,000 pico shared 1:2; output all the gateway's; web search ($0.01) by all
    # tokens, 3:2. The shares add up to the whole exactly.
    assert shares == {KEY_GW: 3_000_000 + 30_000_000 + 6_000_000_000, KEY_OTHER: 6_000_000 + 4_000_000_000}
    assert sum(s or 0 for s in shares.values()) == cents_to_pico(Decimal("1.0039"))
    assert notes and "shared among 2 keys" in notes[0]


@pytest.mark.parametrize("amount", [0.45, None, "NaN", "lots"])
def test_a_cost_amount_that_is_not_a_decimal_string_stops_the_import(amount: Any) -> None:
    api = FakeAdminApi({("usage", None): {"data": [], "has_more": False, "next_page": None},
                        ("cost", None): {"data": [bucket(DAY, [{**cost(SONNET, "output_tokens", "0"), "amount": amount}])],
                                         "has_more": False, "next_page": None}})
    with pytest.raises(ImportFailed, match="amount"):
        import_anthropic_admin(api, "https://api.anthropic.test/v1", DAY, NEXT)


def test_a_repeating_cursor_stops_the_import() -> None:
    looping = {"data": [], "has_more": True, "next_page": "page_1"}
    api = FakeAdminApi({("usage", None): looping, ("usage", "page_1"): looping})
    with pytest.raises(ImportFailed, match="repeats"):
        import_anthropic_admin(api, "https://api.anthropic.test/v1", DAY, NEXT)


POLICY = parse_policy("""\
version: 1
upstreams:
  hosted: {kind: openai, base_url: "http://provider.test/v1", api_key_env: T_OPENAI_KEY}
  hosted-admin: {kind: openai, base_url: "http://provider.test/v1", api_key_env: T_OPENAI_KEY, admin_key_env: T_OPENAI_ADMIN}
  claude: {kind: anthropic, base_url: "http://claude.test", api_key_env: T_CLAUDE_KEY, admin_key_env: T_CLAUDE_ADMIN}
  claude-no-admin: {kind: anthropic, base_url: "http://claude.test", api_key_env: T_CLAUDE_KEY}
models:
  m: {upstream: hosted}
""")


class RecordingClients:
    def __init__(self, pages: FakeAdminApi | None = None) -> None:
        self.headers: list[dict[str, str]] = []
        self.pages = pages

    def __call__(self, headers: Mapping[str, str]) -> RecordingClients:
        self.headers.append(dict(headers))
        return self

    def json(self, url: str, params: Mapping[str, QueryValue]) -> dict[str, Any]:
        if self.pages is not None:
            return self.pages(url, params)
        return {"data": [], "has_more": False, "next_page": None}

    def text(self, url: str) -> str:
        return ""

    def close(self) -> None:
        pass


def test_each_provider_reads_its_reports_with_the_admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"T_OPENAI_KEY": "sk-infer", "T_OPENAI_ADMIN": "sk-admin-openai", "T_CLAUDE_KEY": "sk-ant-api-x",
                        "T_CLAUDE_ADMIN": "sk-ant-admin-secret"}.items():
        monkeypatch.setenv(name, value)
    clients = RecordingClients(two_days_one_key())
    imported = import_provider_rows(parse_provider("claude", POLICY), POLICY, DAY, AFTER, clients)
    assert clients.headers == [{"x-api-key": "sk-ant-admin-secret", "anthropic-version": "2023-06-01"}]
    assert [r.cost_pico for r in imported.rows] == [19_935_000_000, 90_000_000]
    assert "Anthropic Admin API" in imported.source and "secret" not in imported.source

    for upstream, bearer in (("hosted", "sk-infer"), ("hosted-admin", "sk-admin-openai")):
        clients = RecordingClients()
        import_provider_rows(parse_provider(upstream, POLICY), POLICY, DAY, NEXT, clients)
        assert clients.headers == [{"authorization": f"Bearer {bearer}"}]


def test_an_anthropic_upstream_without_an_admin_key_says_one_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_CLAUDE_KEY", "sk-ant-api-secret")
    monkeypatch.delenv("T_CLAUDE_ADMIN", raising=False)
    assert parse_provider("claude-no-admin", POLICY) == ProviderSpec("anthropic_api", "claude-no-admin")
    with pytest.raises(ImportFailed) as no_field:
        import_provider_rows(parse_provider("claude-no-admin", POLICY), POLICY, DAY, NEXT, RecordingClients())
    assert "Admin API key" in str(no_field.value) and "admin_key_env" in str(no_field.value)
    with pytest.raises(ImportFailed) as unset:
        import_provider_rows(parse_provider("claude", POLICY), POLICY, DAY, NEXT, RecordingClients())
    assert "T_CLAUDE_ADMIN" in str(unset.value)
    assert "secret" not in str(no_field.value) + str(unset.value)
