"""The gateway's errors rendered in Anthropic's shape: the type and status the anthropic
SDK turns into its own exception classes."""

from __future__ import annotations

import pytest

from gateway.api.anthropic_errors import anthropic_body, anthropic_headers, anthropic_status
from gateway.errors import (
    AllUpstreamsFailed,
    AuthenticationFailed,
    BodyTooLarge,
    BudgetExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NotReady,
    RateLimited,
    UpstreamError,
    UpstreamTimeout,
)


@pytest.mark.parametrize(("error", "status", "kind"), [
    (AuthenticationFailed("bad key"), 401, "authentication_error"),
    (ModelNotFound("no such model"), 404, "not_found_error"),
    (InvalidRequest("max_tokens: Field required"), 400, "invalid_request_error"),
    (BodyTooLarge("too big"), 413, "request_too_large"),
    (RateLimited("slow down"), 429, "rate_limit_error"),
    (BudgetExceeded("out of budget"), 429, "rate_limit_error"),
    (UpstreamTimeout("too slow"), 504, "timeout_error"),
    (NotReady("ledger down"), 503, "api_error"),
    (GatewayError("bug"), 500, "api_error"),
    (UpstreamError("upstream broke"), 502, "api_error"),
])
def test_each_error_has_its_anthropic_type_and_status(error: GatewayError, status: int, kind: str) -> None:
    error.headers["x-request-id"] = "req_1"
    assert anthropic_status(error) == status
    assert anthropic_body(error) == {"type": "error", "error": {"type": kind, "message": error.message}, "request_id": "req_1"}


def test_an_upstream_overloaded_through_every_retry_is_overloaded_to_the_client() -> None:
    overloaded = UpstreamError("upstream `claude` answered 529: Overloaded")
    overloaded.upstream_status = 529
    for error in (overloaded, AllUpstreamsFailed([overloaded, overloaded])):
        assert anthropic_status(error) == 529
        assert anthropic_body(error)["error"]["type"] == "overloaded_error"


def test_a_budget_refusal_says_retrying_will_not_help() -> None:
    headers = anthropic_headers(BudgetExceeded("out of budget", headers={"x-request-id": "req_2"}))
    assert headers["x-should-retry"] == "false"
    assert headers["request-id"] == headers["x-request-id"] == "req_2"
