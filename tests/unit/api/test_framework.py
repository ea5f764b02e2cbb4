"""Every response of the framework app carries an `x-request-id`, the 500 that Starlette
renders outside the app's middleware included, and it is ours, not the client's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
from starlette.testclient import TestClient

from gateway.api.framework import build_framework
from gateway.services import Services
from gateway.telemetry.ids import IdSource


class BrokenServices(SimpleNamespace):
    """Just enough of Services for the app to be built; readiness fails unexpectedly."""

    def __init__(self) -> None:
        policy = SimpleNamespace(defaults=SimpleNamespace(max_body_bytes=1 << 20))  # read by the body limit on each request
        super().__init__(pipeline=SimpleNamespace(parts=SimpleNamespace(ids=IdSource())),
                         settings=SimpleNamespace(gateway_admin_key=None),
                         policies=SimpleNamespace(current=SimpleNamespace(policy=policy)))

    async def readiness(self) -> dict[str, tuple[bool, str]]:
        raise RuntimeError("a bug, with a path: /srv/gateway/var/ledger.db")


def test_an_unexpected_error_is_a_500_with_a_request_id_and_the_id_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with TestClient(build_framework(cast(Services, BrokenServices())), raise_server_exceptions=False) as client:
        reply = client.get("/readyz", headers={"x-request-id": "client-chosen"})
    assert reply.status_code == 500 and reply.json()["error"]["type"] == "server_error"
    request_id = reply.headers["x-request-id"]
    assert request_id.startswith("req_") and request_id != "client-chosen"
    assert "/srv" not in reply.text
    assert request_id in caplog.text, "the operator can find the request the client reports"


def test_each_response_has_its_own_id_errors_included() -> None:
    with TestClient(build_framework(cast(Services, BrokenServices())), raise_server_exceptions=False) as client:
        replies = [client.get("/no/such/path"), client.post("/readyz"), client.get("/admin/costs")]
    assert [r.status_code for r in replies] == [404, 405, 403]
    ids = [r.headers["x-request-id"] for r in replies]
    assert len(set(ids)) == 3 and all(i.startswith("req_") for i in ids)
    assert all(r.headers.get_list("x-request-id") == [i] for r, i in zip(replies, ids, strict=True))
