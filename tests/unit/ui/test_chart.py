"""The spend chart: one bar per day of the month, stacked by tenant, heights in
proportion to the amounts, every segment naming its day, tenant and amount."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import date
from decimal import Decimal

from gateway.ui.chart import PALETTE, nice_ceiling, spend_per_day
from gateway.ui.figures import Month

SVG = "{http://www.w3.org/2000/svg}"
NOVEMBER = Month(date(2026, 11, 1))


def rows(*items: tuple[str, str, str]) -> list[dict[str, str]]:
    return [{"day": day, "tenant": tenant, "cost_usd": cost} for day, tenant, cost in items]


def test_bars_stack_by_tenant_with_heights_in_proportion() -> None:
    chart = spend_per_day(rows(("2026-11-02", "acme", "3.00"), ("2026-11-02", "globex", "1.00"), ("2026-11-05", "acme", "2.00")),
                          NOVEMBER)
    svg = ET.fromstring(chart.svg)
    assert svg.get("role") == "img" and "Spend per day, November 2026: $6.00" in (svg.get("aria-label") or "")
    bars = [(r.findtext(f"{SVG}title") or "", float(r.get("height", 0)), r.get("fill")) for r in svg.iter(f"{SVG}rect")]
    titles = [t for t, _, _ in bars]
    assert titles == ["2026-11-02 · acme · $3.00 ($3.00)", "2026-11-02 · globex · $1.00 ($1.00)", "2026-11-05 · acme · $2.00 ($2.00)"]
    heights = {t.split(" · ")[0] + t.split(" · ")[1]: h for t, h, _ in bars}
    assert abs(heights["2026-11-02acme"] / heights["2026-11-02globex"] - 3) < 0.01
    assert abs(heights["2026-11-05acme"] / heights["2026-11-02globex"] - 2) < 0.01
    assert [s.name for s in chart.series] == ["acme", "globex"] and chart.total == Decimal(6)
    assert {fill for _, _, fill in bars} == {PALETTE[0], PALETTE[1]}
    labels = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "axis day"]
    assert labels[0] == "1" and labels[-1] == "30" and len(labels) == 30


def test_the_axis_is_labelled_in_round_dollars_or_finer() -> None:
    assert nice_ceiling(Decimal("6")) == Decimal("8")
    assert nice_ceiling(Decimal("0.000078")) == Decimal("0.00008")
    assert nice_ceiling(Decimal("0.000081")) == Decimal("0.0001")
    assert nice_ceiling(Decimal("91")) == Decimal("100")
    big = ET.fromstring(spend_per_day(rows(("2026-11-02", "acme", "6.00")), NOVEMBER).svg)
    assert [t.text for t in big.iter(f"{SVG}text") if t.get("class") == "axis money"] == ["$0.00", "$2.00", "$4.00", "$6.00", "$8.00"]
    tiny = ET.fromstring(spend_per_day(rows(("2026-11-02", "acme", "0.000081")), NOVEMBER).svg)
    assert [t.text for t in tiny.iter(f"{SVG}text") if t.get("class") == "axis money"] == \
        ["$0.00", "$0.000025", "$0.000050", "$0.000075", "$0.000100"]


def test_many_tenants_keep_distinct_colours_and_the_rest_are_others() -> None:
    many = rows(*((f"2026-11-0{1 + i % 9}", f"t{i}", f"{20 - i}.00") for i in range(10)))
    chart = spend_per_day(many, NOVEMBER)
    assert [s.name for s in chart.series] == ["t0", "t1", "t2", "t3", "t4", "t5", "others"]
    assert chart.series[-1].total == sum(Decimal(20 - i) for i in range(6, 10))
    assert len({s.colour for s in chart.series}) == len(chart.series)


def test_a_month_without_spend_says_so_and_names_escape() -> None:
    empty = spend_per_day([], NOVEMBER)
    assert "No spend in November 2026" in empty.svg and "<rect" not in empty.svg
    odd = spend_per_day(rows(("2026-11-02", "<b>&", "1.00")), NOVEMBER).svg
    assert "<b>" not in odd and "&lt;b&gt;&amp;" in odd
    assert not re.search(r"<script", odd)
