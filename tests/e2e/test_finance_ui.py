"""The finance dashboard over HTTP, as a browser meets it: the admin key goes in once,
in a form, and comes back as nothing but an HttpOnly, SameSite=Strict session cookie;
without that cookie no page or download shows a figure; each table's CSV is the admin
API's CSV. (tests/e2e/test_finance_browser.py drives the same pages in Chromium.)"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import openai
import pytest

from gateway.ui.figures import Month
from tests.support.stack import ADMIN_KEY, Stack

HELLO: Any = [{"role": "user", "content": "hello"}]
DATA_PATHS = ["/ui/export/tenants.csv", "/ui/export/days.csv", "/ui/export/models.csv", "/ui/export/upstreams.csv",
              "/ui/export/tasks.csv", "/ui/export/reconcile.csv?provider=hosted", "/ui/reconcile", "/ui/tasks/task_x"]


@pytest.fixture(scope="module")
def traffic(stack: Stack) -> str:
    """Calls from both tenants, one in a task; returns the task's id."""
    acme = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
    globex = openai.OpenAI(base_url=stack.gateway, api_key=stack.other_key, max_retries=0)
    task = httpx.post(f"{stack.gateway}/tasks", json={"budget_usd": "1.00"}, headers={"authorization": f"Bearer {stack.key}"}).json()
    acme.chat.completions.create(model="sim-large", messages=HELLO, max_tokens=60, extra_headers={"x-task-id": task["id"]})
    acme.chat.completions.create(model="gpt-4o-mini", messages=HELLO, max_tokens=30)
    globex.chat.completions.create(model="gpt-4o-mini", messages=HELLO, max_tokens=20)
    return str(task["id"])


@contextlib.contextmanager
def signed_in(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.root, timeout=30) as client:
        reply = client.post("/ui/sign-in", data={"admin_key": ADMIN_KEY})
        assert reply.status_code == 303 and reply.headers["location"] == "/ui/"
        yield client


def test_signing_in_sets_an_httponly_strict_cookie_and_no_key_in_any_url(stack: Stack) -> None:
    with httpx.Client(base_url=stack.root, timeout=30) as client:
        page = client.get("/ui/")
        assert page.status_code == 200 and 'type="password"' in page.text and 'method="post"' in page.text
        reply = client.post("/ui/sign-in", data={"admin_key": ADMIN_KEY})
    cookie = reply.headers["set-cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "path", "max-age"} <= attributes
    assert "samesite=strict" in cookie.lower() and "path=/ui" in cookie.lower()
    assert "secure" not in attributes, "plain http on loopback: a Secure cookie would never be sent back"
    assert ADMIN_KEY not in cookie and ADMIN_KEY not in reply.headers["location"]
    assert reply.headers["cache-control"] == "no-store"
    assert "frame-ancestors 'none'" in reply.headers["content-security-policy"]


def test_a_wrong_key_shows_the_form_again_with_an_error(stack: Stack) -> None:
    for form in ({"admin_key": "wrong"}, {"admin_key": ADMIN_KEY + "x"}, {}, {"other": ADMIN_KEY}):
        reply = httpx.post(f"{stack.root}/ui/sign-in", data=form)
        assert reply.status_code == 401 and "set-cookie" not in reply.headers
        assert "not this gateway&#39;s admin key" in reply.text and 'type="password"' in reply.text
    as_json = httpx.post(f"{stack.root}/ui/sign-in", json={"admin_key": ADMIN_KEY})
    assert as_json.status_code == 401, "only the form posts the key"
    in_url = httpx.get(f"{stack.root}/ui/", params={"admin_key": ADMIN_KEY})
    assert "set-cookie" not in in_url.headers and 'id="tenants"' not in in_url.text


def test_without_a_valid_session_no_data_request_shows_a_figure(stack: Stack, traffic: str) -> None:
    with signed_in(stack) as client:
        token = client.cookies["gateway_ui_session"]
    forged = token.rsplit(".", 1)[0] + ".AAAA"
    for cookies in ({}, {"gateway_ui_session": forged}, {"gateway_ui_session": "v1.9999999999.x.y"}):
        with httpx.Client(base_url=stack.root, cookies=cookies, timeout=30) as client:
            for path in [*DATA_PATHS, f"/ui/tasks/{traffic}"]:
                reply = client.get(path)
                assert reply.status_code == 401, (path, cookies)
                assert "$" not in reply.text and "acme" not in reply.text and "tenant,cost_usd" not in reply.text, path
            home = client.get("/ui/", params={"month": Month.containing(datetime.now(UTC)).key})
            assert home.status_code == 200 and 'id="tenants"' not in home.text and "$" not in home.text
    with httpx.Client(base_url=stack.root, timeout=30) as client:
        assert client.get("/ui/export/tenants.csv", headers={"authorization": f"Bearer {ADMIN_KEY}"}).status_code == 401, \
            "the dashboard takes its session, not the admin API's bearer key"


def test_each_table_exports_the_admin_apis_csv(stack: Stack, traffic: str) -> None:
    month = Month.containing(datetime.now(UTC))
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    with signed_in(stack) as client:
        page = client.get("/ui/", params={"month": month.key})
        assert page.status_code == 200
        for tenant in (None, "acme"):
            scope = {"tenant": tenant} if tenant else {}
            window = {"from": month.start.isoformat(), "to": month.end.isoformat(), **scope, "format": "csv"}
            for table, group_by in (("tenants", "tenant"), ("days", "day,tenant"), ("models", "model"), ("upstreams", "upstream")):
                ours = client.get(f"/ui/export/{table}.csv", params={"month": month.key, **scope})
                theirs = httpx.get(f"{stack.root}/admin/costs", params={"group_by": group_by, **window}, headers=admin)
                assert ours.status_code == 200 and ours.text == theirs.text and ours.text.count("\n") >= 2, (table, tenant)
                assert ours.headers["content-disposition"].startswith("attachment")
            tasks = client.get("/ui/export/tasks.csv", params={"month": month.key, **scope})
            assert tasks.text == httpx.get(f"{stack.root}/admin/tasks", params=window, headers=admin).text
            assert traffic in tasks.text
        reconciled = client.get("/ui/export/reconcile.csv", params={"month": month.key, "provider": "hosted"})
        until = min(month.end, datetime.now(UTC).date() + timedelta(days=1)).isoformat()
        report = httpx.get(f"{stack.root}/admin/reconcile", headers=admin,
                           params={"provider": "hosted", "since": month.start.isoformat(), "until": until, "format": "csv"})
        assert reconciled.status_code == 200 and reconciled.text == report.text
        assert reconciled.text.startswith("upstream,day,model,") and ",gpt-4o-mini,,matched,2,2," in reconciled.text and ",sim-large,,matched,1,1," in reconciled.text
        page_links = page.text
        assert "/admin/costs?group_by=tenant&amp;from=" in page_links and "/admin/tasks?from=" in page_links


def test_the_task_page_shows_its_books(stack: Stack, traffic: str) -> None:
    with signed_in(stack) as client:
        page = client.get(f"/ui/tasks/{traffic}")
        assert page.status_code == 200 and traffic in page.text and "sim-large" in page.text and "$1.00" in page.text
        assert client.get("/ui/tasks/task_nope").status_code == 404


def test_signing_out_ends_the_session_even_for_a_copied_cookie(stack: Stack) -> None:
    with signed_in(stack) as client:
        token = client.cookies["gateway_ui_session"]
        assert client.get("/ui/export/tenants.csv").status_code == 200
        out = client.post("/ui/sign-out")
        assert out.status_code == 303 and "max-age=0" in out.headers["set-cookie"].lower()
        assert client.get("/ui/export/tenants.csv").status_code == 401
    with httpx.Client(base_url=stack.root, cookies={"gateway_ui_session": token}, timeout=30) as copied:
        assert copied.get("/ui/export/tenants.csv").status_code == 401
