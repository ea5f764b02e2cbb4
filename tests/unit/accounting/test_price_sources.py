"""Reading litellm's price map: what a plain JSON decode would give, priced on demand."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from gateway.accounting.importers import reconcile_upstream
from gateway.accounting.prices import PriceCatalog, PricingInvalid, every_model_priced
from gateway.routing.loader import PolicyInvalid, parse_policy
from gateway.routing.policy import Price

NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
POLICY = """\
version: 1
upstreams:
  hosted: {kind: openai, base_url: "http://provider.test/v1"}
models:
  mini:
    upstream: hosted
    price: {input: 0.15, output: 0.60}
"""


def load(tmp_path: Path, text: str) -> PriceCatalog:
    (tmp_path / "pricing").mkdir()
    path = tmp_path / "litellm.json"
    path.write_text(text, encoding="utf-8")
    return PriceCatalog.load(tmp_path / "pricing", path)


def input_price(catalog: PriceCatalog, model: str) -> Decimal | None:
    quote = catalog.quote(model, None, None, NOW)
    return None if quote is None else quote.input


def test_litellm_map_reads_entries_as_a_plain_json_decode_would(tmp_path: Path) -> None:
    # Written by hand: json.dumps cannot repeat a key. The last value of a repeated key
    # wins; members that are not prices (nested objects, lists) change nothing.
    cat = load(tmp_path, """{
        "replaced": {"input_cost_per_token": 1e-6}, "replaced": "no longer an object",
        "restored": "not yet an object", "restored": {"input_cost_per_token": 2e-6},
        "repriced": {"input_cost_per_token": 1e-6, "input_cost_per_token": 3e-6, "output_cost_per_token": 4e-6},
        "nested": {"input_cost_per_token": 5e-7, "supported_regions": ["eu"],
                   "tiered_pricing": [{"input_cost_per_token": 9e-6}], "search_cost": {"input_cost_per_token": 8e-6}},
        "a-list": [{"input_cost_per_token": 1e-6}]
    }""")
    assert [input_price(cat, m) for m in ("replaced", "restored", "repriced", "nested", "a-list")] == [
        None, Decimal(2), Decimal(3), Decimal("0.5"), None]


@pytest.mark.parametrize(("text", "expected"), [
    ("[1, 2]", "litellm's price map is not a JSON object"),
    ("{not json", "cannot read litellm's price map: Expecting property name"),
])
def test_an_unreadable_litellm_map_is_refused_when_first_needed(tmp_path: Path, text: str, expected: str) -> None:
    catalog = load(tmp_path, text)
    assert catalog.quote("m", None, Price(input=Decimal("0.1"), output=Decimal("0.2")), NOW) is not None  # not needed
    with pytest.raises(PricingInvalid, match=expected):
        input_price(catalog, "m")
    with pytest.raises(PricingInvalid, match=expected):
        catalog.read_map()


def test_a_policy_that_prices_its_models_never_reads_litellms_map(tmp_path: Path) -> None:
    catalog = load(tmp_path, "{not json")  # were it read, it would be refused
    policy = parse_policy(POLICY, check=every_model_priced(catalog))
    assert catalog.quote("mini", None, policy.models["mini"].price, NOW) is not None


def test_a_policy_that_needs_an_unreadable_map_is_invalid_and_says_why(tmp_path: Path) -> None:
    catalog = load(tmp_path, "{not json")
    with pytest.raises(PolicyInvalid) as info:
        parse_policy(POLICY.replace("    price: {input: 0.15, output: 0.60}\n", ""), "policy.yaml", every_model_priced(catalog))
    assert [str(p) for p in info.value.problems] == [
        f"policy.yaml: models: {tmp_path / 'litellm.json'}: cannot read litellm's price map: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"]


def test_reconciliation_reads_the_map_before_any_work(tmp_path: Path) -> None:
    # Provider rows may name any model: an unreadable map fails the job up front, not
    # half-way through (here before the provider's CSV, which does not exist, is read).
    catalog = load(tmp_path, "{not json")
    policy = parse_policy(POLICY, check=every_model_priced(catalog))
    with pytest.raises(PricingInvalid, match="cannot read litellm's price map"):
        asyncio.run(reconcile_upstream(create_engine("sqlite://"), policy, f"csv:{tmp_path / 'usage.csv'}", NOW.date(),
                                       catalog=catalog))
