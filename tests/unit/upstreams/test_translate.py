from __future__ import annotations

import orjson
import pytest

from gateway.errors import InvalidRequest, ModelNotFound, RateLimited, UpstreamError
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


def test_an_internal_url_host_and_key_in_an_upstream_message_are_redacted() -> None:
    message = ("upstream connect error: POST http://10.0.3.7:8000/v1/chat/completions via gpu-3.pool.internal:8443 "
               "with Bearer sk-live-0123456789abcdef failed")
    for status in (400, 408, 429, 500, 503):
        err = error_from_reply("hosted", status, {}, orjson.dumps({"error": {"message": message}}))
        for leaked in ("10.0.3.7", "8000", "gpu-3", "8443", "sk-live", "/v1/chat"):
            assert leaked not in err.message, (status, err.message)
        assert "upstream connect error" in err.message and "[redacted url]" in err.message
        assert err.body()["error"]["message"] == err.message


def test_a_long_message_is_cut_after_redaction() -> None:
    err = error_from_reply("hosted", 500, {}, orjson.dumps({"error": {"message": "http://10.0.0.1/ " + "x" * 1000}}))
    assert err.message.endswith("...") and "10.0.0.1" not in err.message and len(err.message) < 400


@pytest.mark.parametrize("body", [
    {"error": {"message": "The model `gpt-4o-mini-2024-07-18` does not exist or you do not have access to it.",
               "type": "invalid_request_error", "param": None, "code": "model_not_found"}},  # OpenAI
    {"error": {"message": "The model `llama-70b` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}},  # vLLM
    {"error": {"message": "The model `llama-70b` does not exist.", "type": "NotFoundError", "param": None, "code": 404}},
    {"type": "error", "error": {"type": "not_found_error", "message": "model: claude-9"}},  # Anthropic
])
def test_an_upstream_404_for_the_model_is_model_not_found_and_not_retryable(body: dict[str, object]) -> None:
    err = error_from_reply("hosted", 404, {}, orjson.dumps(body))
    assert isinstance(err, ModelNotFound) and err.http_status == 404
    assert err.body()["error"]["type"] == "invalid_request_error" and err.body()["error"]["code"] == "model_not_found"
    assert err.response_headers()["x-should-retry"] == "false"


def test_an_upstream_404_for_the_path_is_not_about_the_model() -> None:
    err = error_from_reply("hosted", 404, {}, b'{"detail": "Not Found"}')
    assert not isinstance(err, ModelNotFound) and err.http_status == 502
