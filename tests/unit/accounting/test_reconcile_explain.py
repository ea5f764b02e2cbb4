"""Why a group differs: a token difference is priced at each kind of token's own rate,
cache writes included, so a call the gateway never saw is explained at its full cost."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from gateway.accounting.prices import PriceQuote
from gateway.accounting.reconcile_explain import MISSING_AT_GATEWAY, Amounts, LedgerGroup, cost_at, explain

# Claude Haiku 4.5, USD per 1M tokens: 5-minute writes at 1.25x input, 1-hour ones at 2x.
HAIKU = PriceQuote(input=Decimal("1.00"), cached_input=Decimal("0.10"), cache_write=Decimal("1.25"), output=Decimal("5.00"),
                   source="policy", effective_from=None, cache_write_1h=Decimal("2.00"))
# 1000 uncached, 3000 read, 400 written for 5 minutes, 200 for an hour; 250 out.
CALL = Amounts(requests=1, input_tokens=4600, cached_tokens=3000, output_tokens=250, cache_write_tokens=600,
               cache_write_1h_tokens=200)
CALL_PICO = (1000 * 100 + 3000 * 10 + 400 * 125 + 200 * 200 + 250 * 500) * 10_000  # 3,450 micro-dollars


def test_each_kind_of_token_is_priced_at_its_own_rate() -> None:
    assert cost_at(HAIKU, CALL) == CALL_PICO == 3_450_000_000
    without_writes = Amounts(requests=1, input_tokens=4000, cached_tokens=3000, output_tokens=250)
    assert cost_at(HAIKU, without_writes) == (1000 * 100 + 3000 * 10 + 250 * 500) * 10_000


def test_a_call_missing_at_the_gateway_is_explained_whole_with_no_price_drift() -> None:
    billed_but_not_booked = replace(CALL, cost_pico=CALL_PICO)  # provider minus ledger
    [reason] = explain(billed_but_not_booked, LedgerGroup(), True, HAIKU, tolerance=0)  # one reason: no price drift
    assert reason.reason == MISSING_AT_GATEWAY
    assert reason.amounts == billed_but_not_booked
    assert "+4600 input (+3000 cached, +600 cache writes)" in reason.describe()
