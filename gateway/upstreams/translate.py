"""Upstream error replies -> our errors. Bodies are never passed through raw: the
message is extracted, stripped of credentials, URLs and hosts (upstreams/redaction.py),
and shortened."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import orjson

from gateway.errors import GatewayError, InvalidRequest, ModelNotFound, RateLimited, UpstreamError, UpstreamTimeout
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
    message = upstream_message(body, secrets)
    err = _error_object(body)
    if status == 404 and _names_the_model(err):
        # Not retryable and no mark against the upstream: the name is wrong, not the
        # upstream. The retry module renames it to the model the client asked for.
        error: GatewayError = ModelNotFound(f"upstream `{upstream}` does not serve the model it was sent: {message}",
                                            param="model")
    else:
        error = _translate(upstream, status, headers, message)
    error.upstream_status = status
    error.upstream_headers = limit_headers(headers)
    code = err.get("code")
    error.upstream_code = code if isinstance(code, str) else None
    return error


def limit_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Only what says when to come back: rate-limit state and retry-after."""
    return {k: v for k, v in headers.items() if k.startswith(LIMIT_HEADER_PREFIXES)}


def _error_object(body: bytes) -> dict[str, object]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    err = data.get("error") if isinstance(data, dict) else None
    return err if isinstance(err, dict) else {}


def _names_the_model(err: dict[str, object]) -> bool:
    """A 404 about the model, as OpenAI (`code: model_not_found`), vLLM (`NotFoundError`,
    `param: model`) and Anthropic (`not_found_error`, "model: ...") say it - not a 404
    for the path, which is a wrong base_url."""
    if err.get("code") == "model_not_found" or err.get("param") == "model":
        return True
    message = err.get("message")
    return err.get("type") in ("NotFoundError", "not_found_error") and isinstance(message, str) and "model" in message.lower()


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
