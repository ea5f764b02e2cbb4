"""The one error tree. Each error knows its HTTP status, OpenAI error `type` and `code`,
and whether retrying can help; one handler renders them all in OpenAI's shape.

Imports nothing from the package, so every layer may raise these.
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None
    retryable: ClassVar[bool] = False
    # Set when the error is an upstream's answer: its status and rate-limit headers,
    # which the retry module reads to decide whether and when to try again.
    upstream_status: int | None = None
    upstream_headers: dict[str, str] | None = None
    upstream_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = dict(headers or {})

    @property
    def http_status(self) -> int:
        return self.status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response_headers(self) -> dict[str, str]:
        # The openai SDK honours x-should-retry over its own status rules.
        return {"x-should-retry": "true" if self.retryable else "false", **self.headers}


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class MalformedJSON(InvalidRequest):
    code = "invalid_json"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "invalid_request_error"
    code = "permission_denied"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, method: str, path: str, allowed: str) -> None:
        super().__init__(f"{method} is not allowed on {path}", headers={"allow": allowed})


class ModelNotFound(NotFound):
    code = "model_not_found"


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"
    retryable = True


class BudgetExceeded(GatewayError):
    """A budget (tenant period or task) cannot cover the request's worst-case cost."""

    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    code = "upstream_error"
    retryable = True


class UpstreamBadReply(UpstreamError):
    """The upstream answered, but not with what the gateway accepts: a malformed head, or
    one over the gateway's bounds. It may have done (and billed) the work, so asking
    again could be billed again: never retried."""

    code = "upstream_bad_reply"
    retryable = False


class UpstreamReplyTooLarge(UpstreamBadReply):
    """One streamed event, or a whole body, over the gateway's bound."""

    code = "upstream_reply_too_large"


class ReplicaFailed(UpstreamError):
    """One replica of a pool failed before answering (refused, reset, gone) and is taken
    out; another replica of the same pool can take the request at once."""

    code = "upstream_replica_failed"

    def __init__(self, message: str, replica: str) -> None:
        super().__init__(message)
        self.replica = replica  # booked with the attempt: which replica failed


class PoolSpill(UpstreamError):
    """A self-hosted pool cannot serve the request in time (`saturated`) or at all
    (`unhealthy`): the request goes to the model's hosted fallback instead, unretried."""

    status = 503
    code = "pool_unavailable"

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"spilled to the fallback ({reason}): {detail}")
        self.reason = reason


class UpstreamTimeout(GatewayError):
    status = 504
    type = "timeout"
    code = "upstream_timeout"
    retryable = True


class NotReady(GatewayError):
    status = 503
    type = "server_error"
    code = "not_ready"
    retryable = True
    RETRY_AFTER_S = 2  # what a dependency's outage usually takes to be noticed over, or to pass

    def response_headers(self) -> dict[str, str]:
        return {"retry-after": str(self.RETRY_AFTER_S), **super().response_headers()}


class AllUpstreamsFailed(UpstreamError):
    """Carries each attempt's error so the client and the log see why every target failed."""

    def __init__(self, errors: list[GatewayError]) -> None:
        last = errors[-1]
        detail = "; ".join(f"attempt {i + 1}: {e.message}" for i, e in enumerate(errors))
        super().__init__(f"all upstream attempts failed ({detail})")
        self.errors = errors
        self._last = last

    @property
    def http_status(self) -> int:
        # A timeout on the final attempt is still a timeout to the client (504).
        return self._last.http_status

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["error"]["code"] = type(self.errors[-1]).code
        return body
