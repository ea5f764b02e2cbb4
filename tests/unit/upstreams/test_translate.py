from __future__ import annotations

from gateway.errors import InvalidRequest, RateLimited, UpstreamError
from gateway.upstreams.translate import error_from_reply


def test_upstream_400_becomes_a_client_error_with_its_message() -> None:
    err = error_from_reply("hosted", 400, {}, b'{"error": {"message": "max_tokens is too large"}}')
    assert isinstance(err, InvalidRequest) and err.http_status == 400
    assert "max_tokens is too large" in err.message


def test_credentials_never_leak_into_the_message() -> None:
    body = b'{"error": {"message": "Incorrect API key provided: sk-proj-abcdefghijkl. Bearer sk-proj-abcdefghijkl"}}'
    err = error_from_reply("hosted", 401, {}, body, secrets=("sk-proj-abcdefghijkl",))
    assert isinstance(err, UpstreamError) and err.http_status == 502
    assert "sk-proj" not in err.message
    err = error_from_reply("hosted", 500, {}, body, secrets=("sk-proj-abcdefghijkl",))
    assert "sk-proj" not in err.message and "[redacted]" in err.message


def test_429_keeps_retry_after() -> None:
    err = error_from_reply("hosted", 429, {"retry-after": "2", "retry-after-ms": "1500"}, b"{}")
    assert isinstance(err, RateLimited)
    assert err.response_headers()["retry-after"] == "2"


def test_non_json_error_body_is_not_relayed() -> None:
    err = error_from_reply("hosted", 503, {}, b"<html>upstream proxy secret-host-10.0.0.1</html>")
    assert "secret-host" not in err.message and err.http_status == 502
