"""The finance dashboard of a gateway with no admin key: off, and saying how to turn it on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from starlette.testclient import TestClient

from gateway.api.framework import build_framework
from gateway.services import Services
from gateway.telemetry.ids import IdSource


def test_without_an_admin_key_the_dashboard_is_off_and_says_why() -> None:
    policy = SimpleNamespace(defaults=SimpleNamespace(max_body_bytes=1 << 20))
    services = SimpleNamespace(pipeline=SimpleNamespace(parts=SimpleNamespace(ids=IdSource())),
                               settings=SimpleNamespace(gateway_admin_key=None),
                               policies=SimpleNamespace(current=SimpleNamespace(policy=policy)))
    with TestClient(build_framework(cast(Services, services))) as client:
        home = client.get("/ui/")
        assert home.status_code == 403 and "GATEWAY_ADMIN_KEY" in home.text and 'type="password"' not in home.text
        assert home.headers["x-request-id"].startswith("req_")
        assert client.post("/ui/sign-in", data={"admin_key": ""}).status_code == 403
        assert client.get("/ui/export/tenants.csv").status_code == 403
        assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
        style = client.get("/ui/static/ui.css")
        assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
