"""The gateway's errors in Anthropic's shape, for the Messages API endpoints:
`{"type": "error", "error": {"type", "message"}, "request_id"}` with the status the
anthropic SDK maps to its own exception classes. The errors themselves are the one tree
in gateway/errors.py; this only renders them in another dialect, from their status."""

from __future__ import annotations

from typing import Any

from gateway.errors import AllUpstreamsFailed, GatewayError

OVERLOADED = 529  # Anthropic's "overloaded" status
TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
         405: "invalid_request_error", 408: "timeout_error", 413: "request_too_large", 422: "invalid_request_error",
         429: "rate_limit_error", 431: "request_too_large", 504: "timeout_error", OVERLOADED: "overloaded_error"}


def anthropic_status(error: GatewayError) -> int:
    # An upstream that stayed overloaded through the retries is overloaded to the client too.
    last = error.errors[-1] if isinstance(error, AllUpstreamsFailed) else error
    return OVERLOADED if last.upstream_status == OVERLOADED else error.http_status


def anthropic_body(error: GatewayError) -> dict[str, Any]:
    status = anthropic_status(error)
    kind = TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": error.message}}
    request_id = error.headers.get("x-request-id")
    if request_id:
        body["request_id"] = request_id
    return body


def anthropic_headers(error: GatewayError) -> dict[str, str]:
    headers = error.response_headers()  # x-should-retry: the anthropic SDK honours it too
    if "x-request-id" in headers:
        headers["request-id"] = headers["x-request-id"]  # where the SDK looks for it
    return headers
