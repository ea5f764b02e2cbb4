"""The price catalog: the numbers finance would check against an invoice."""

from __future__ import annotations

import json
import random
import textwrap
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from gateway.accounting.price_sources import installed_litellm_price_map, read_pricing_file
from gateway.accounting.prices import PriceCatalog, PriceQuote, PricingInvalid, missing_prices, show_price, usd
from gateway.routing.loader import load_policy_file, parse_policy
from gateway.routing.policy import Price
from gateway.types.usage import Usage

ROOT = Path(__file__).resolve().parents[3]
PRICING = ROOT / "pricing"
NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def catalog(tmp_path: Path, overrides: str | None = None, litellm: dict[str, object] | None = None) -> PriceCatalog:
    pricing = tmp_path / "pricing"
    pricing.mkdir(exist_ok=True)
    if overrides is not None:
        write(pricing, "overrides.yaml", overrides)
    litellm_json = None
    if litellm is not None:
        litellm_json = tmp_path / "litellm.json"
        litellm_json.write_text(json.dumps(litellm), encoding="utf-8")
    return PriceCatalog.load(pricing, litellm_json)


def quote(cat: PriceCatalog, model: str, at: datetime = NOW, upstream: str | None = None) -> PriceQuote:
    result = cat.quote(model, upstream, None, at)
    assert result is not None, f"{model} has no price"
    return result


def litellm_entry(model: str) -> dict[str, Decimal]:
    found = installed_litellm_price_map()
    assert found is not None, "litellm's bundled price map is not installed"
    entries = json.loads(found[0].read_text(encoding="utf-8"), parse_float=Decimal)
    return entries[model]  # type: ignore[no-any-return]


HISTORY = """\
kind: token_prices
entries:
  - model: acme-chat
    effective_from: 2025-01-01
    input: 1.00
    output: 4.00
    note: launch price
  - model: acme-chat
    effective_from: 2025-06-01
    input: 0.50
    cached_input: 0.25
    output: 2.00
    note: price cut announced 2025-05-20
  - model: gpt-4o-mini
    effective_from: 2025-01-01
    input: 0.20
    output: 0.80
    note: negotiated rate (test)
"""


# ---- precedence ----------------------------------------------------------------------


def test_policy_price_wins_over_override_and_litellm(tmp_path: Path) -> None:
    cat = catalog(tmp_path, HISTORY)
    policy_price = Price(input=Decimal("0.11"), output=Decimal("0.44"))
    result = cat.quote("gpt-4o-mini", None, policy_price, NOW)
    assert result is not None
    assert (result.input, result.output, result.source) == (Decimal("0.11"), Decimal("0.44"), "policy")


def test_override_wins_over_litellm(tmp_path: Path) -> None:
    result = quote(catalog(tmp_path, HISTORY), "gpt-4o-mini")
    assert (result.input, result.output) == (Decimal("0.20"), Decimal("0.80"))
    assert result.source == "pricing/overrides.yaml (effective 2025-01-01)"


def test_override_for_the_model_name_wins_over_litellm_for_the_upstream_name(tmp_path: Path) -> None:
    result = quote(catalog(tmp_path, HISTORY), "acme-chat", upstream="gpt-4o-mini")
    assert result.input == Decimal("0.50")


def test_litellm_prices_a_model_nobody_overrode(tmp_path: Path) -> None:
    entry = litellm_entry("gpt-4o-mini")
    result = quote(catalog(tmp_path), "gpt-4o-mini")
    assert result.input == entry["input_cost_per_token"] * 1_000_000 == Decimal("0.15")
    assert result.cached_input == entry["cache_read_input_token_cost"] * 1_000_000 == Decimal("0.075")
    assert result.output == entry["output_cost_per_token"] * 1_000_000 == Decimal("0.60")
    assert result.source.startswith("litellm 1.108.7 price map")


def test_litellm_is_found_by_upstream_model_and_without_provider_prefix(tmp_path: Path) -> None:
    cat = catalog(tmp_path)
    assert quote(cat, "cheap-chat", upstream="gpt-4o-mini").input == Decimal("0.15")
    assert quote(cat, "openai/gpt-4o-mini").output == Decimal("0.60")


def test_litellm_cache_write_price_is_used(tmp_path: Path) -> None:
    entry = litellm_entry("claude-sonnet-4-5")
    result = quote(catalog(tmp_path), "claude-sonnet-4-5")
    assert result.cache_write == entry["cache_creation_input_token_cost"] * 1_000_000 > result.input


def test_unknown_model_has_no_price(tmp_path: Path) -> None:
    assert catalog(tmp_path, HISTORY).quote("no-such-model", "nor-this", None, NOW) is None


# ---- effective dates -----------------------------------------------------------------


def test_a_request_before_a_price_change_pays_the_old_price(tmp_path: Path) -> None:
    cat = catalog(tmp_path, HISTORY)
    before = quote(cat, "acme-chat", datetime(2025, 5, 31, 23, 59, 59, tzinfo=UTC))
    after = quote(cat, "acme-chat", datetime(2025, 6, 1, 0, 0, tzinfo=UTC))
    assert (before.input, before.output, str(before.effective_from)) == (Decimal("1.00"), Decimal("4.00"), "2025-01-01")
    assert (after.input, after.cached_input, after.output) == (Decimal("0.50"), Decimal("0.25"), Decimal("2.00"))
    assert after.source == "pricing/overrides.yaml (effective 2025-06-01)"


def test_effective_dates_are_utc_days(tmp_path: Path) -> None:
    # 01:00 in UTC+2 on the day of the change is still the previous day in UTC.
    at = datetime(2025, 6, 1, 1, 0, tzinfo=timezone(timedelta(hours=2)))
    assert quote(catalog(tmp_path, HISTORY), "acme-chat", at).input == Decimal("1.00")


def test_a_request_before_the_first_row_falls_back_to_litellm_or_nothing(tmp_path: Path) -> None:
    cat = catalog(tmp_path, HISTORY)
    old = datetime(2024, 12, 31, tzinfo=UTC)
    assert cat.quote("acme-chat", None, None, old) is None
    assert quote(cat, "gpt-4o-mini", old).input == Decimal("0.15")  # litellm's


# ---- cost, exactly -------------------------------------------------------------------


GPT_4O_MINI = PriceQuote(Decimal("0.15"), Decimal("0.075"), Decimal("0.15"), Decimal("0.60"), "test", None)


def test_cached_tokens_are_billed_at_the_cached_price_to_the_pico_dollar() -> None:
    usage = Usage(prompt_tokens=10_000, cached_tokens=4_000, completion_tokens=500)
    # 6,000 x 0.15 + 4,000 x 0.075 + 500 x 0.60, per 1M tokens = 0.0009 + 0.0003 + 0.0003 USD
    assert GPT_4O_MINI.cost_pico(usage) == 1_500_000_000
    assert usd(GPT_4O_MINI.cost_pico(usage)) == "0.001500"
    assert GPT_4O_MINI.saved_pico(usage) == 300_000_000  # 4,000 x (0.15 - 0.075) per 1M


def test_cache_writes_are_billed_at_the_cache_write_price() -> None:
    sonnet = PriceQuote(Decimal("3"), Decimal("0.30"), Decimal("3.75"), Decimal("15"), "test", None)
    usage = Usage(prompt_tokens=2_000, cached_tokens=500, cache_write_tokens=1_000, completion_tokens=100, reasoning_tokens=40)
    # 500 x 3 + 500 x 0.30 + 1,000 x 3.75 + 100 x 15 (reasoning is inside completion)
    assert sonnet.cost_pico(usage) == 6_900_000_000


def test_one_hour_cache_writes_are_billed_at_their_own_price() -> None:
    sonnet = PriceQuote(Decimal("3"), Decimal("0.30"), Decimal("3.75"), Decimal("15"), "test", None, cache_write_1h=Decimal("6"))
    usage = Usage(prompt_tokens=2_000, cached_tokens=500, cache_write_tokens=1_000, cache_write_1h_tokens=600, completion_tokens=100)
    # 500 x 3 + 500 x 0.30 + 400 x 3.75 + 600 x 6 + 100 x 15
    assert sonnet.cost_pico(usage) == 8_250_000_000
    odd = PriceQuote(Decimal("3"), Decimal("0.30"), Decimal("3.75"), Decimal("15"), "test", None, cache_write_1h=Decimal("6.0000001"))
    assert odd.per_token is None and odd.cost_pico(usage) == 8_250_000_000 + 60  # 600 x 0.0000001 USD per 1M, exact
    assert sonnet.worst_case_pico(1, 0) == 6_000_000  # the dearest input-side rate bounds a hold


def test_a_one_hour_rate_falls_back_to_litellms_then_to_the_cache_write_price(tmp_path: Path) -> None:
    entry = litellm_entry("claude-sonnet-4-5")
    cat = catalog(tmp_path)
    anthropic_style = Price(input=Decimal("3"), output=Decimal("15"), cache_write=Decimal("3.75"))
    found = cat.quote("claude", "claude-sonnet-4-5", anthropic_style, NOW)
    assert found is not None and found.cache_write_1h == entry["cache_creation_input_token_cost_above_1hr"] * 1_000_000
    own = cat.quote("claude", "claude-sonnet-4-5", Price(input=Decimal("3"), output=Decimal("15"), cache_write=Decimal("3.75"),
                                                         cache_write_1h=Decimal("7")), NOW)
    assert own is not None and own.cache_write_1h == Decimal("7")
    unknown = cat.quote("claude", "claude-nonesuch", anthropic_style, NOW)
    assert unknown is not None and unknown.cache_write_1h == Decimal("3.75")
    assert quote(cat, "claude-sonnet-4-5").cache_write_1h == entry["cache_creation_input_token_cost_above_1hr"] * 1_000_000


def test_one_token_costs_exactly_its_price() -> None:
    assert GPT_4O_MINI.cost_pico(Usage(prompt_tokens=1)) == 150_000
    assert GPT_4O_MINI.cost_pico(Usage(completion_tokens=1)) == 600_000


def test_prices_finer_than_six_decimals_round_half_even_once() -> None:
    fine = PriceQuote(Decimal("0.0000005"), Decimal("0.0000005"), Decimal("0.0000005"), Decimal("0"), "test", None)
    assert fine.cost_pico(Usage(prompt_tokens=1)) == 0  # 0.5 pico
    assert fine.cost_pico(Usage(prompt_tokens=3)) == 2  # 1.5 pico
    assert fine.cost_pico(Usage(prompt_tokens=5)) == 2  # 2.5 pico


def test_costs_are_the_exact_product_of_tokens_and_rates_whole_or_not() -> None:
    rng = random.Random(11)
    for rates in [("0.15", "0.075", "0.15", "0.6"), ("3", "0.3", "3.75", "15"), ("0.034722222", "0", "0.034722222", "0.462962963")]:
        price = PriceQuote(*(Decimal(r) for r in rates), "test", None)
        assert (price.per_token is None) == any(len(r.partition(".")[2]) > 6 for r in rates)
        for _ in range(500):
            prompt = rng.randint(0, 200_000)
            cached = rng.randint(0, prompt)
            usage = Usage(prompt, cached, rng.randint(0, prompt - cached), rng.randint(0, 8_192))
            exact = Fraction(0)  # USD per 1M tokens -> pico-dollars: x 1e6 per token
            for tokens, rate in [(prompt - cached - usage.cache_write_tokens, rates[0]), (cached, rates[1]),
                                 (usage.cache_write_tokens, rates[2]), (usage.completion_tokens, rates[3])]:
                exact += tokens * Fraction(rate) * 1_000_000
            assert price.cost_pico(usage) == round(exact), (rates, usage)
            assert price.saved_pico(usage) == round(cached * (Fraction(rates[0]) - Fraction(rates[1])) * 1_000_000)


def test_worst_case_covers_every_usage_within_its_bounds() -> None:
    rng = random.Random(7)
    quotes = [
        GPT_4O_MINI,
        PriceQuote(Decimal("3"), Decimal("0.30"), Decimal("3.75"), Decimal("15"), "cache writes dearer", None),
        PriceQuote(Decimal("0.034722222"), Decimal("0"), Decimal("0.034722222"), Decimal("0.462962963"), "self-hosted", None),
    ]
    for price in quotes:
        for _ in range(2_000):
            prompt, bound = rng.randint(0, 200_000), rng.randint(0, 8_192)
            cached = rng.randint(0, prompt)
            usage = Usage(prompt, cached, rng.randint(0, prompt - cached), rng.randint(0, bound))
            assert price.worst_case_pico(prompt, bound) >= price.cost_pico(usage), (price.source, usage)


@pytest.mark.parametrize(
    ("pico", "text"),
    [
        (0, "0.000000"),
        (1_500_000_000, "0.001500"),
        (12_345_000_000, "0.012345"),
        (1, "0.000000000001"),
        (150_000, "0.00000015"),
        (10**12, "1.000000"),
        (123 * 10**12 + 4_560_000, "123.00000456"),
        (-2_500_000, "-0.0000025"),
    ],
)
def test_usd_is_exact_with_at_least_six_decimals(pico: int, text: str) -> None:
    assert usd(pico) == text


def test_usd_reads_back_as_exactly_the_amount() -> None:
    rng = random.Random(5)
    for pico in [rng.randint(-10**16, 10**16) for _ in range(20_000)] + [rng.randint(0, 10**9) * 10**6 for _ in range(2_000)]:
        text = usd(pico)
        assert Decimal(text) == Decimal(pico).scaleb(-12), pico
        assert len(text.partition(".")[2]) >= 6


# ---- self-hosted GPU-hour rates --------------------------------------------------------


def test_gpu_hours_become_a_per_token_rate(tmp_path: Path) -> None:
    write(tmp_path / "pricing", "selfhosted.yaml", """\
        kind: gpu_hours
        entries:
          - model: pool-model
            effective_from: 2025-01-01
            gpu_hour_usd: "2.50"
            gpus: 1
            expected_tokens_per_second: {input: 20000, output: 1500}
            note: one GPU
          - model: big-pool
            effective_from: 2025-01-01
            gpu_hour_usd: 3.60
            gpus: 8
            expected_tokens_per_second: {input: 8000, output: 1000}
            cached_input: 0.01
            note: eight GPUs
        """)
    cat = PriceCatalog.load(tmp_path / "pricing")
    pool = quote(cat, "pool-model")
    # 2.50 USD/h / 3600 s / 20,000 tok/s x 1M = 0.0347222...; / 1,500 tok/s = 0.4629629...
    assert (pool.input, pool.output, pool.cached_input) == (Decimal("0.034722222"), Decimal("0.462962963"), Decimal(0))
    assert pool.cache_write == pool.input
    big = quote(cat, "big-pool")
    # 3.60 x 8 = 28.80 USD/h = 0.008 USD/s; / 8,000 tok/s x 1M = 1.00; / 1,000 tok/s x 1M = 8.00
    assert (big.input, big.output, big.cached_input) == (Decimal(1), Decimal(8), Decimal("0.01"))
    assert big.cost_pico(Usage(prompt_tokens=8_000, completion_tokens=1_000)) == 16_000_000_000  # one second: 0.016 USD


# ---- files ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(PRICING.glob("*.yaml")), ids=lambda p: p.name)
def test_every_pricing_file_loads(path: Path) -> None:
    assert read_pricing_file(path), f"{path.name} has no entries"


def test_shipped_prices_cover_the_demo_policy_without_its_own_prices() -> None:
    cat = PriceCatalog.load(PRICING)
    policy = load_policy_file(ROOT / "policies" / "demo.yaml")
    unpriced = policy.model_copy(update={"models": {n: m.model_copy(update={"price": None}) for n, m in policy.models.items()}})
    assert missing_prices(policy, cat, NOW) == []
    assert missing_prices(unpriced, cat, NOW) == []
    assert quote(cat, "sim-large").output == Decimal("10.00")
    assert quote(cat, "gpt-4o-mini", datetime(2024, 9, 1, tzinfo=UTC)).cached_input == Decimal("0.15")  # before caching


def test_missing_prices_names_models_without_any_price(tmp_path: Path) -> None:
    policy = parse_policy(textwrap.dedent("""\
        version: 1
        upstreams:
          pool: {kind: vllm, base_url: "http://127.0.0.1:9200/v1"}
        models:
          mystery-model: {upstream: pool}
          priced: {upstream: pool, price: {input: 1, output: 2}}
          aliased: {upstream: pool, upstream_model: gpt-4o-mini}
        """))
    assert missing_prices(policy, catalog(tmp_path), NOW) == ["mystery-model"]


def test_numbers_in_pricing_files_are_exact_decimals(tmp_path: Path) -> None:
    cat = catalog(tmp_path, """\
        kind: token_prices
        entries:
          - {model: m, effective_from: 2025-01-01, input: 0.1, cached_input: 0.2, output: 0.3, note: x}
        """)
    assert quote(cat, "m").input + quote(cat, "m").cached_input == Decimal("0.3") == quote(cat, "m").output


BAD = """\
kind: token_prices
entries:
  - model: good
    effective_from: 2025-01-01
    input: 1
    output: 2
    note: fine
  - model: typo-model
    effective_from: 2025-01-01
    input: 1
    cached_input: -0.5
    output: 2
    colour: red
    note: broken
"""


def test_a_bad_pricing_file_names_file_line_and_entry(tmp_path: Path) -> None:
    with pytest.raises(PricingInvalid) as info:
        catalog(tmp_path, BAD)
    path = tmp_path / "pricing" / "overrides.yaml"
    assert sorted(info.value.problems) == [
        f"{path}:11: entries[1] (model typo-model): cached_input: Input should be greater than or equal to 0",
        f"{path}:13: entries[1] (model typo-model): colour: unknown key",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("entries: []\n", ":1: kind: must be token_prices or gpu_hours"),
        ("kind: token_prices\nentries:\n  - {model: m, effective_from: 2025-01-01, input: 1, output: 2}\n",
         ":3: entries[0] (model m): note: required key is missing"),
        ("kind: token_prices\nentries:\n  - model: m\n    model: n\n", ":4: entries[0].model: duplicate key `model`"),
        ("kind: token_prices\nentries:\n  - {model: m, effective_from: 2025-01-01, input: .inf, output: 2, note: x}\n",
         ":3: entries[0] (model m): input: "),
        ("kind: token_prices\nentries: [\n", "not valid YAML"),
        ("kind: token_prices\nentries: &e\n  - *e\n", ":2: entries[0]: this alias names a node that contains it"),
        ("kind: token_prices\na: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdef", "bcdefg", strict=True)),
         ": the aliases here make "),
        ("kind: token_prices\n# padding\n" + "#" * 4 * 2**20, ": the file is over 4 MiB"),
    ],
)
def test_each_kind_of_mistake_is_reported_readably(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path / "pricing", "bad.yaml", text)
    with pytest.raises(PricingInvalid) as info:
        PriceCatalog.load(tmp_path / "pricing")
    assert info.value.problems[0].startswith(str(path)) and expected in info.value.problems[0], info.value.problems


def test_two_prices_for_the_same_model_and_day_are_refused(tmp_path: Path) -> None:
    row = "kind: token_prices\nentries:\n  - {model: m, effective_from: 2025-01-01, input: 1, output: 2, note: x}\n"
    write(tmp_path / "pricing", "a.yaml", row)
    write(tmp_path / "pricing", "b.yaml", row.replace("input: 1", "input: 3"))
    with pytest.raises(PricingInvalid, match=r"pricing/b.yaml: model m has two prices effective 2025-01-01 \(also in pricing/a.yaml\)"):
        PriceCatalog.load(tmp_path / "pricing")


def test_litellm_map_is_read_as_exact_data(tmp_path: Path) -> None:
    cat = catalog(tmp_path, litellm={
        "sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0},
        "artifact-model": {"input_cost_per_token": 5.0000000000000004e-8, "output_cost_per_token": 2e-6, "litellm_provider": "x"},
        "embed-model": {"input_cost_per_token": 2e-8, "litellm_provider": "x"},
        "per-second-model": {"output_cost_per_token": 1e-6, "output_cost_per_second": 0.001},
    })
    artifact = quote(cat, "artifact-model")
    assert (artifact.input, artifact.output) == (Decimal("0.05"), Decimal("2"))  # float noise removed
    assert quote(cat, "embed-model").output == 0
    assert cat.quote("per-second-model", None, None, NOW) is None
    assert cat.quote("sample_spec", None, None, NOW) is None
    assert artifact.source == f"litellm price map {tmp_path / 'litellm.json'}"


# ---- what people read ----------------------------------------------------------------


def test_describe_shows_price_source_and_history(tmp_path: Path) -> None:
    text = catalog(tmp_path, HISTORY).describe("acme-chat", None, None, datetime(2025, 3, 1, tzinfo=UTC))
    assert "effective price: input 1, cached input 1, cache write 1, output 4 (USD per 1M tokens)" in text
    assert "source: pricing/overrides.yaml (effective 2025-01-01)" in text
    assert "from 2025-01-01" in text and "from 2025-06-01" in text and "note: price cut announced 2025-05-20" in text
    [current] = [line for line in text.splitlines() if "<- in effect" in line]
    assert "from 2025-01-01" in current


def test_describe_marks_the_litellm_entry_in_effect(tmp_path: Path) -> None:
    cat = catalog(tmp_path, litellm={"acme/chat-model": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6,
                                                          "litellm_provider": "acme"}})
    text = cat.describe("acme/chat-model", None, None, NOW)
    assert f"source: litellm price map {tmp_path / 'litellm.json'}" in text
    [current] = [line for line in text.splitlines() if "<- in effect" in line]
    assert "entry `acme/chat-model` (acme): input 1, cached input 1, cache write 1, output 2" in current


def test_show_price_uses_the_policy_and_fails_for_unpriced_models() -> None:
    code, text = show_price("pool-model", str(ROOT / "policies" / "demo.yaml"), PRICING, NOW)
    assert code == 0 and "source: policy" in text and "derived from 2.50 USD/GPU-hour" in text
    code, text = show_price("pool-model", None, PRICING, NOW)
    assert code == 0 and "source: pricing/selfhosted.yaml (effective 2024-01-01)" in text
    code, text = show_price("auto", str(ROOT / "policies" / "demo.yaml"), PRICING, NOW)
    assert code == 1 and "auto is a route" in text
    code, text = show_price("no-such-model", None, PRICING, NOW)
    assert code == 1 and "no price" in text
