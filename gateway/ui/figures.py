"""How the dashboard writes figures, and the calendar month it reports on.

Money arrives as exact decimal strings (the ledger's pico-dollars, via
accounting/money.py) and is shown to the cent, rounded half up - except an amount under
half a cent that is not zero, shown as under a cent: spend that rounds to `$0.00` would
read as none at all. The exact amount stays in the CSV exports and in each cell's title."""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

CENT = Decimal("0.01")
SECONDS_PER_DAY = 86_400


def dollars(amount: Decimal) -> str:
    """`$1,234.57`: to the cent, half up; negative amounts as `-$0.42`; a non-zero
    amount that would round to nothing as `<$0.01` (or `-<$0.01`)."""
    cents = amount.quantize(CENT, rounding=ROUND_HALF_UP)
    sign = "-" if amount < 0 else ""
    if cents == 0 and amount != 0:
        return f"{sign}<${CENT}"
    return f"{sign}${abs(cents):,.2f}"


def to_cent(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def count(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def percent(part: Decimal, whole: Decimal) -> str:
    if whole <= 0:
        return "—"
    share = (part * 100 / whole).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)
    return f"{share}%"


@dataclass(frozen=True, slots=True)
class Month:
    """A calendar month in UTC: [start, end) as days, as the admin API's `from`/`to`."""

    start: date

    @classmethod
    def containing(cls, moment: datetime) -> Month:
        return cls(moment.astimezone(UTC).date().replace(day=1))

    @classmethod
    def parse(cls, text: str | None, now: datetime) -> Month:
        """`2026-11`; anything else (or nothing) is the current month."""
        if text:
            try:
                year, month = (int(part) for part in text.split("-"))
                return cls(date(year, month, 1))
            except ValueError:
                pass
        return cls.containing(now)

    @property
    def end(self) -> date:
        days = calendar.monthrange(self.start.year, self.start.month)[1]
        return self.start + timedelta(days=days)

    @property
    def days(self) -> int:
        return (self.end - self.start).days

    @property
    def key(self) -> str:
        return self.start.strftime("%Y-%m")

    @property
    def label(self) -> str:
        return self.start.strftime("%B %Y")

    def elapsed_days(self, now: datetime) -> Fraction:
        """Days of the month gone by at `now` (0 before it starts, all of it after)."""
        start = datetime.combine(self.start, datetime.min.time(), tzinfo=UTC)
        seconds = (min(max(now, start), datetime.combine(self.end, datetime.min.time(), tzinfo=UTC)) - start).total_seconds()
        return Fraction(int(seconds), SECONDS_PER_DAY)

    def over(self, now: datetime) -> bool:
        return self.elapsed_days(now) >= self.days


@dataclass(frozen=True, slots=True)
class Burn:
    """Average spend per day so far, and the month's spend if it goes on at that rate.
    The rate divides by at least one day, so a month's first hours do not extrapolate
    a single call to a month."""

    per_day: Decimal
    forecast: Decimal
    final: bool  # the month is over: the forecast is what was spent

    @classmethod
    def of(cls, spend: Decimal, month: Month, now: datetime) -> Burn:
        elapsed = month.elapsed_days(now)
        if month.over(now):
            return cls(spend / month.days, spend, True)
        per_day = Fraction(spend) / max(elapsed, Fraction(1))
        forecast = Fraction(spend) + per_day * (month.days - elapsed)
        return cls(_decimal(per_day), _decimal(forecast), False)


def _decimal(value: Fraction) -> Decimal:
    return Decimal(value.numerator) / Decimal(value.denominator)
