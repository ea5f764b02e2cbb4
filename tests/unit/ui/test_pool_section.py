"""The dashboard's self-hosted pool section: the pool's whole GPU cost for the month so
far, each tenant's share, idle, and what the internal rates recovered - the figures
`gateway pool costs` and `/admin/pool` give, on the page finance opens."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from html import escape
from pathlib import Path

from gateway.accounting.pool_costs import pool_cost_report
from gateway.ui import pages
from gateway.ui.figures import Month, dollars
from gateway.ui.render import Pages
from tests.unit.accounting.test_pool_costs import book, catalog, ledger, policy

NOW = datetime(2026, 11, 3, 12, tzinfo=UTC)


def _cells(html: str, first: str) -> list[str]:
    row = re.search(rf"<tr><td>{first}</td>(.*?)</tr>", html, re.S)
    assert row is not None, f"no row for {first}"
    return re.findall(r'<td class="num">(.*?)</td>', row.group(1))


def test_the_page_splits_the_pools_cost_to_tenants_and_idle(tmp_path: Path) -> None:
    engine = ledger(tmp_path)
    start = datetime(2026, 11, 2, tzinfo=UTC)
    for i in range(30):
        book(engine, "acme" if i % 3 else "globex", start + timedelta(minutes=i), 4000, 1000, 300, "0.000100")
    prices = catalog(tmp_path)
    context = pages.dashboard(engine, policy(), prices, Month(date(2026, 11, 1)), None, NOW)
    html = Pages().render("dashboard.html", signed_in=True, **context)

    expected = pool_cost_report(engine, policy(), prices, "pool", datetime(2026, 11, 1, tzinfo=UTC), NOW)
    section = html[html.index('<section id="pool">'):]
    assert "No self-hosted pool cost yet" not in section
    cost = Decimal(expected["cost_usd"])
    assert cost > 0 and f"${cost:,.2f}" in section
    shares = {t["tenant"]: t for t in expected["tenants"]}
    for tenant in ("acme", "globex"):
        cells = _cells(section, tenant)
        assert cells[0] == str(shares[tenant]["requests"])
        assert cells[2] == escape(dollars(Decimal(shares[tenant]["share_usd"])))
    assert _cells(section, "idle")[0] == escape(dollars(Decimal(expected["idle_usd"])))
    assert sum(Decimal(t["share_usd"]) for t in expected["tenants"]) + Decimal(expected["idle_usd"]) == cost


def test_a_month_that_has_not_begun_says_so(tmp_path: Path) -> None:
    engine = ledger(tmp_path)
    context = pages.dashboard(engine, policy(), catalog(tmp_path), Month(date(2026, 12, 1)), None, NOW)
    html = Pages().render("dashboard.html", signed_in=True, **context)
    assert "the month has not begun" in html[html.index('<section id="pool">'):]
