"""Upstream error replies -> our errors. Bodies are never passed through raw: the
message is extracted, stripped of credentials, URLs and hosts (upstreams/redaction.py),
and shortened."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import orjson

from gateway.errors import GatewayError, InvalidRequest, RateLimited, UpstreamError, UpstreamTimeout
from gateway.upstreams.redaction import redact

MAX_MESSAGE = 300
RETRY_HEADERS = ("retry-after", "retry-after-ms")
LIMIT_HEADER_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "retry-after")


def upstream_message(body: bytes, secrets: Iterable[str] = ()) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "the upstream sent a body that is not JSON"
    message: object = None
    if isinstance(data, Mapping):
        err = data.get("error")
        if isinstance(err, Mapping):
            message = err.get("message")
        elif isinstance(err, str):
            message = err
        message = message or data.get("message") or data.get("detail")
    text = redact(str(message), secrets) if message else "no error message"
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def error_from_reply(
    upstream: str, status: int, headers: Mapping[str, str], body: bytes, secrets: Iterable[str] = ()
) -> GatewayError:
    error = _translate(upstream, status, headers, upstream_message(body, secrets))
    error.upstream_status = status
    error.upstream_headers = limit_headers(headers)
    error.upstream_code = _error_code(body)
    return error


def limit_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Only what says when to come back: rate-limit state and retry-after."""
    return {k: v for k, v in headers.items() if k.startswith(LIMIT_HEADER_PREFIXES)}


def _error_code(body: bytes) -> str | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    err = data.get("error") if isinstance(data, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None


def _translate(upstream: str, status: int, headers: Mapping[str, str], message: str) -> GatewayError:
    if status in (400, 422):
        return InvalidRequest(f"upstream `{upstream}` rejected the request: {message}")
    if status == 429:
        retry = {h: headers[h] for h in RETRY_HEADERS if h in headers}
        return RateLimited(f"upstream `{upstream}` is rate limiting: {message}", headers=retry)
    if status == 408:
        return UpstreamTimeout(f"upstream `{upstream}` timed out (408): {message}")
    if status in (401, 403):
        return UpstreamError(f"upstream `{upstream}` refused the gateway's credentials ({status}); check the key the policy names")
    return UpstreamError(f"upstream `{upstream}` answered {status}: {message}")
