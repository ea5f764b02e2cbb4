"""The spend-per-day chart, drawn as SVG on the server: a bar per day of the month,
stacked by tenant, with a dollar axis. No script and no chart library - the browser
only lays out shapes - and each bar segment names its day, tenant and amount in a
tooltip (`<title>`), which screen readers read too."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from html import escape
from typing import Any

from gateway.ui.figures import Month, dollars

# Okabe-Ito: told apart with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
OTHERS_COLOUR = "#999999"
WIDTH, HEIGHT = 960, 280
LEFT, RIGHT, TOP, BOTTOM = 72, 12, 14, 30
NICE_STEPS = (Decimal(1), Decimal(2), Decimal("2.5"), Decimal(5))
GRID_LINES = 4


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    colour: str
    total: Decimal


@dataclass(frozen=True, slots=True)
class Chart:
    svg: str
    series: tuple[Series, ...]
    total: Decimal


def spend_per_day(rows: Iterable[Mapping[str, Any]], month: Month) -> Chart:
    """`rows`: the admin API's cost rows grouped by day and tenant."""
    amounts: dict[tuple[date, str], Decimal] = defaultdict(Decimal)
    for row in rows:
        amounts[(date.fromisoformat(str(row["day"])), str(row["tenant"]))] += Decimal(row["cost_usd"])
    series = _series(amounts)
    names = {s.name for s in series}
    stacked: dict[tuple[date, str], Decimal] = defaultdict(Decimal)
    for (day, tenant), amount in amounts.items():
        stacked[(day, tenant if tenant in names else "others")] += amount
    days = [month.start + timedelta(days=i) for i in range(month.days)]
    daily = {day: sum((stacked[(day, s.name)] for s in series), Decimal(0)) for day in days}
    total = sum(daily.values(), Decimal(0))
    top = nice_ceiling(max(daily.values(), default=Decimal(0)))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" class="chart" '
             f'aria-label="Spend per day, {escape(month.label)}: {escape(dollars(total))} in all">',
             f"<title>Spend per day, {escape(month.label)}</title>"]
    parts += _axis(top)
    parts += _bars(days, series, stacked, top)
    parts += _day_labels(days)
    if total == 0:
        parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{(TOP + HEIGHT - BOTTOM) / 2}" class="empty" '
                     f'text-anchor="middle">No spend in {escape(month.label)}</text>')
    parts.append("</svg>")
    return Chart("".join(parts), tuple(series), total)


def _series(amounts: Mapping[tuple[date, str], Decimal]) -> list[Series]:
    """Tenants by spend, largest first; past the palette, the rest together as `others`."""
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for (_, tenant), amount in amounts.items():
        totals[tenant] += amount
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    named = ranked if len(ranked) <= len(PALETTE) else ranked[: len(PALETTE) - 1]
    series = [Series(name, PALETTE[i], amount) for i, (name, amount) in enumerate(named)]
    rest = ranked[len(named):]
    if rest:
        series.append(Series("others", OTHERS_COLOUR, sum((amount for _, amount in rest), Decimal(0))))
    return series


def nice_ceiling(value: Decimal) -> Decimal:
    """The smallest 1, 2, 2.5 or 5 times a power of ten, times the grid lines, that is at
    least `value`: axis labels at round amounts."""
    if value <= 0:
        return Decimal("0.04")
    exponent = value.adjusted() - 1
    while True:
        for step in NICE_STEPS:
            candidate = step.scaleb(exponent) * GRID_LINES
            if candidate >= value:
                return candidate
        exponent += 1


def _y(amount: Decimal, top: Decimal) -> float:
    return TOP + float((1 - amount / top) * (HEIGHT - TOP - BOTTOM))


def _axis(top: Decimal) -> list[str]:
    out = []
    step = top / GRID_LINES
    for i in range(GRID_LINES + 1):
        amount = step * i
        y = _y(amount, top)
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="axis money">{escape(axis_label(amount, step))}</text>')
    return out


def axis_label(amount: Decimal, step: Decimal) -> str:
    """Dollars to the cent, or finer when the grid steps are under a cent."""
    if step >= Decimal("0.01") or amount == 0:
        return dollars(amount)
    places = max(2, -int(step.normalize().as_tuple().exponent))
    return f"${amount:.{places}f}"


def _bars(days: list[date], series: list[Series], stacked: Mapping[tuple[date, str], Decimal], top: Decimal) -> list[str]:
    out = []
    slot = (WIDTH - LEFT - RIGHT) / len(days)
    width = slot * 0.7
    for index, day in enumerate(days):
        x = LEFT + slot * index + (slot - width) / 2
        base = Decimal(0)
        for s in series:
            amount = stacked.get((day, s.name), Decimal(0))
            if amount <= 0:
                continue
            y_top, y_base = _y(base + amount, top), _y(base, top)
            height = max(y_base - y_top, 0.5)  # a sliver stays visible
            out.append(f'<rect x="{x:.1f}" y="{y_base - height:.1f}" width="{width:.1f}" height="{height:.1f}" fill="{s.colour}">'
                       f"<title>{day.isoformat()} · {escape(s.name)} · {escape(dollars(amount))} (${amount})</title></rect>")
            base += amount
    return out


def _day_labels(days: list[date]) -> list[str]:
    slot = (WIDTH - LEFT - RIGHT) / len(days)
    every = 1 if slot >= 26 else 2
    return [f'<text x="{LEFT + slot * (i + 0.5):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle" class="axis day">{day.day}</text>'
            for i, day in enumerate(days) if i % every == 0]
