"""HTTP calls to the tools the policy declares. Like model traffic, tool traffic goes
through one pooled client that only this package creates."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.routing.policy import Tool

if TYPE_CHECKING:
    import httpx

MAX_TOOL_BODY = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ToolReply:
    body: bytes
    content_type: str
    seconds: float


class ToolClient:
    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        # Created on the first tool call: httpx and its TLS context (CA certificates read
        # from disk) cost ~0.1 s of start-up that a gateway without tool calls never needs.
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(trust_env=False, limits=httpx.Limits(max_connections=256))
        return self._client

    async def call(self, name: str, tool: Tool, arguments: Any) -> ToolReply:
        """POST the arguments as JSON, or GET with them as query parameters."""
        start = time.monotonic()
        url = str(tool.url)
        client = self._http()
        import httpx  # loaded by _http(): the name is needed for the exceptions below

        try:
            if tool.method == "GET":
                params = {k: v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in (arguments or {}).items()}
                response = await client.get(url, params=params, timeout=tool.timeout_s)
            else:
                response = await client.post(url, content=orjson.dumps(arguments), timeout=tool.timeout_s,
                                             headers={"content-type": "application/json"})
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"tool `{name}` did not answer within {tool.timeout_s:g}s") from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"tool `{name}` could not be reached: {type(exc).__name__}") from exc
        if response.status_code >= 400:
            raise UpstreamError(f"tool `{name}` answered {response.status_code}")
        if len(response.content) > MAX_TOOL_BODY:
            raise UpstreamError(f"tool `{name}` answered with more than {MAX_TOOL_BODY} bytes")
        return ToolReply(response.content, response.headers.get("content-type", "application/json"), time.monotonic() - start)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
