"""HTTP calls to the tools the policy declares. Like model traffic, tool traffic goes
through one pooled aiohttp session made in `upstreams/sessions.py`, and what a tool
sends back is bounded."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.errors import UpstreamError, UpstreamReplyTooLarge, UpstreamTimeout
from gateway.routing.policy import Tool
from gateway.upstreams.sessions import new_session, proxy_for, read_bounded

MAX_TOOL_BODY = 4 * 1024 * 1024
MAX_CONNECTIONS = 256
KEEPALIVE_S = 4.0


@dataclass(frozen=True, slots=True)
class ToolReply:
    body: bytes
    content_type: str
    seconds: float


class ToolClient:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on the first tool call, inside the event loop that uses it.
        if self._session is None:
            self._session = new_session(max_connections=MAX_CONNECTIONS, keepalive_s=KEEPALIVE_S)
        return self._session

    async def call(self, name: str, tool: Tool, arguments: Any) -> ToolReply:
        """POST the arguments as JSON, or GET with them as query parameters."""
        start = time.monotonic()
        url = str(tool.url)
        timeout = aiohttp.ClientTimeout(total=tool.timeout_s)
        try:
            if tool.method == "GET":
                params = {k: v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in (arguments or {}).items()}
                request = self._client().get(url, params=params, timeout=timeout, proxy=proxy_for(url))
            else:
                request = self._client().post(url, data=orjson.dumps(arguments), timeout=timeout, proxy=proxy_for(url),
                                              headers={"content-type": "application/json"})
            async with request as response:
                if response.status >= 400:
                    raise UpstreamError(f"tool `{name}` answered {response.status}")
                body = await read_bounded(response, MAX_TOOL_BODY, lambda: UpstreamReplyTooLarge(
                    f"tool `{name}` answered with more than {MAX_TOOL_BODY} bytes"))
                content_type = response.headers.get("content-type", "application/json")
        except TimeoutError as exc:
            raise UpstreamTimeout(f"tool `{name}` did not answer within {tool.timeout_s:g}s") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"tool `{name}` could not be reached: {type(exc).__name__}") from exc
        return ToolReply(body, content_type, time.monotonic() - start)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

