"""The finance dashboard in a real browser: Debian's Chromium, driven by playwright,
against a gateway serving on a real socket. It signs in as finance would, reads each
tenant's spend and checks it to the cent against the ledger, finds the chart, downloads
a CSV and compares it with the admin API's, and checks that a browser without the
session cookie sees no figures."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.ui.figures import Month
from tests.support.stack import ADMIN_KEY, Stack, running_stack
from tests.support.system_programs import CHROMIUM_ARGS, debian_program, playwright_available

pytestmark = pytest.mark.browser
HELLO: Any = [{"role": "user", "content": "Please summarise the quarter's invoices."}]


def dear(policy: str) -> str:
    """Prices thousands of times the list prices, so the calls cost dollars and cents."""
    return (policy.replace("{input: 2.50, cached_input: 1.25, output: 10.00}", "{input: 2500, cached_input: 1250, output: 10000}")
                  .replace("{input: 0.15, cached_input: 0.075, output: 0.60}", "{input: 1500, cached_input: 750, output: 6000}"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("browser"), edit_policy=dear) as running:
        acme = openai.OpenAI(base_url=running.gateway, api_key=running.key, max_retries=0)
        globex = openai.OpenAI(base_url=running.gateway, api_key=running.other_key, max_retries=0)
        for tokens in (37, 81, 5):
            acme.chat.completions.create(model="sim-large", messages=HELLO, max_tokens=tokens)
            globex.chat.completions.create(model="gpt-4o-mini", messages=HELLO, max_tokens=tokens + 100)
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = debian_program("chromium", "chromium")
    playwright_available()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def ledger_spend(stack: Stack, month: Month) -> dict[str, Decimal]:
    """Each tenant's spend this month, straight from the ledger's rows (exact)."""
    with sqlite3.connect(stack.var_dir / "ledger.db") as db:
        rows = db.execute("SELECT tenant, SUM(cost_pico) FROM usage_events WHERE day >= ? AND day < ? GROUP BY tenant",
                          (month.start.isoformat(), month.end.isoformat())).fetchall()
    return {tenant: Decimal(pico) / 10**12 for tenant, pico in rows}


def cents(amount: Decimal) -> str:
    """As finance reads it: to the cent, and spend under half a cent as under a cent."""
    rounded = amount.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    return "<$0.01" if rounded == 0 and amount > 0 else f"${rounded:,.2f}"


def test_finance_signs_in_reads_spend_to_the_cent_and_downloads_the_csv(browser: Any, stack: Stack) -> None:
    month = Month.containing(datetime.now(UTC))
    context = browser.new_context(viewport={"width": 1366, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.goto(f"{stack.root}/ui/")
    page.fill("#admin-key", "not-the-key")
    page.click("button[type=submit]")
    assert "not this gateway's admin key" in page.inner_text("[role=alert]")
    assert page.locator("#tenants").count() == 0

    page.fill("#admin-key", ADMIN_KEY)
    page.click("button[type=submit]")
    page.wait_for_selector("#tenants")
    assert ADMIN_KEY not in page.url
    [cookie] = context.cookies()
    assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == ("gateway_ui_session", True, "Strict", "/ui")
    assert page.evaluate("document.cookie") == "", "scripts cannot read the session"

    spend = ledger_spend(stack, month)  # read after the page: the dashboard flushed the books first
    assert set(spend) == {"acme", "globex"} and all(amount >= Decimal("0.10") for amount in spend.values())
    for tenant, amount in spend.items():
        assert page.inner_text(f'#tenants tr[data-tenant="{tenant}"] td[data-field="spend"]') == cents(amount), tenant
    assert page.inner_text('[data-figure="spend"]') == cents(sum(spend.values(), Decimal(0)))

    chart = page.locator("figure svg[role=img]")
    assert chart.count() == 1 and f"Spend per day, {month.label}" in (chart.get_attribute("aria-label") or "")
    assert chart.locator("rect").count() >= 2, "a bar segment per tenant for today"
    assert chart.bounding_box()["width"] > 600, "the chart is laid out at a readable size"

    with page.expect_download() as download:
        page.click("#csv-tenants")
    downloaded = Path(download.value.path()).read_text()
    admin = httpx.get(f"{stack.root}/admin/costs", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                      params={"group_by": "tenant", "from": month.start.isoformat(), "to": month.end.isoformat(), "format": "csv"})
    assert downloaded == admin.text and "acme," in downloaded

    page.click("text=Sign out")
    page.wait_for_selector("#admin-key")
    context.close()


def test_a_browser_without_the_cookie_sees_no_figures(browser: Any, stack: Stack) -> None:
    context = browser.new_context()
    page = context.new_page()
    month = Month.containing(datetime.now(UTC)).key
    home = page.goto(f"{stack.root}/ui/?month={month}&tenant=acme")
    assert home is not None and home.status == 200
    assert page.locator("#admin-key").count() == 1 and page.locator("#tenants, svg[role=img]").count() == 0
    assert "$" not in page.inner_text("body") and "acme" not in page.inner_text("body")
    for path in (f"/ui/export/tenants.csv?month={month}", "/ui/reconcile", f"/ui/export/models.csv?month={month}"):
        refused = page.goto(f"{stack.root}{path}")
        assert refused is not None and refused.status == 401, path
        assert "$" not in page.inner_text("body") and "tenant,cost_usd" not in page.content(), path
    context.close()
