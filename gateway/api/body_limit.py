"""A size limit on every request body the framework app's routes read (the hot paths
bound theirs as they read them: see hot_paths.read_body).

A body declared longer than the limit is refused before any of it is read; a chunked
one is refused as it grows past the limit, so no more than the limit (and one chunk) is
ever held. Either way the answer is a 413 in OpenAI's shape, and the connection closes
after it rather than reading the rest of the body only to drop it."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import error_response
from gateway.errors import BodyTooLarge

# Routes whose bodies are small by nature get a tighter limit than the policy's.
SMALL_BODY_BYTES = 16 * 1024
SMALL_BODIED = ("/v1/tasks", "/admin/")
CLOSE = {"connection": "close"}


def route_limit(path: str, max_body_bytes: int) -> int:
    """The most bytes of body a request to `path` may send."""
    if path.startswith(SMALL_BODIED):
        return min(SMALL_BODY_BYTES, max_body_bytes)
    return max_body_bytes


class BodyLimit:
    """ASGI middleware: `max_body_bytes()` is read per request, so a policy reload that
    changes `defaults.max_body_bytes` applies to the next request."""

    def __init__(self, app: ASGIApp, max_body_bytes: Callable[[], int]) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = route_limit(scope["path"], self.max_body_bytes())
        declared = _content_length(scope["headers"])
        if declared is not None and declared > limit:
            refusal = BodyTooLarge(f"the request body is {declared} bytes; the limit is {limit}", headers=CLOSE)
            await error_response(refusal)(scope, receive, send)
            return
        await self.app(scope, _bounded(receive, limit), send)


def _bounded(receive: Receive, limit: int) -> Receive:
    """`receive`, raising BodyTooLarge (which the app renders as its own error) once the
    body has grown past `limit`."""
    size = 0

    async def bounded_receive() -> Message:
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise BodyTooLarge(f"the request body is over the limit of {limit} bytes", headers=CLOSE)
        return message

    return bounded_receive


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:  # ASGI servers give the names in lower case
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None
