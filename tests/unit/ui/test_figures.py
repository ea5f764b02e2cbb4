"""Figures as finance reads them: dollars to the cent, the month, burn and forecast."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from gateway.ui.figures import Burn, Month, count, dollars, percent


@pytest.mark.parametrize(("amount", "shown"), [
    ("0", "$0.00"), ("0.005", "$0.01"), ("1234.565", "$1,234.57"), ("-0.425", "-$0.43"), ("9999999.995", "$10,000,000.00"),
    # Spend that rounds to nothing is still spend: not shown as $0.00.
    ("0.004999", "<$0.01"), ("0.0000000000001", "<$0.01"), ("-0.000001", "-<$0.01"),
])
def test_dollars_to_the_cent_half_up(amount: str, shown: str) -> None:
    assert dollars(Decimal(amount)) == shown


def test_counts_and_shares() -> None:
    assert count(1234567) == "1,234,567" and count(None) == "—"
    assert percent(Decimal(1), Decimal(3)) == "33.3%" and percent(Decimal(1), Decimal(0)) == "—"


def test_a_month_is_its_calendar_days_in_utc() -> None:
    now = datetime(2026, 2, 10, 12, tzinfo=UTC)
    month = Month.parse(None, now)
    assert (month.start, month.end, month.days, month.key, month.label) == (date(2026, 2, 1), date(2026, 3, 1), 28, "2026-02", "February 2026")
    assert Month.parse("2024-02", now).days == 29
    assert Month.parse("2026-13", now) == month and Month.parse("junk", now) == month
    assert Month.parse("2026-12", now).end == date(2027, 1, 1)
    assert month.elapsed_days(now) == Decimal("9.5")


def test_burn_and_forecast_follow_the_days_gone_by() -> None:
    month = Month(date(2026, 11, 1))  # 30 days
    mid = Burn.of(Decimal("150.00"), month, datetime(2026, 11, 11, tzinfo=UTC))  # 10 days gone
    assert (mid.per_day, mid.forecast, mid.final) == (Decimal(15), Decimal(450), False)
    # Hours into the month, the rate is per day at least: one call is not a month's pace.
    early = Burn.of(Decimal("1.00"), month, datetime(2026, 11, 1, 2, tzinfo=UTC))
    assert early.per_day == Decimal(1) and early.forecast.quantize(Decimal("0.01")) == Decimal("30.92")
    over = Burn.of(Decimal("300.00"), month, datetime(2026, 12, 5, tzinfo=UTC))
    assert (over.per_day, over.forecast, over.final) == (Decimal(10), Decimal(300), True)
