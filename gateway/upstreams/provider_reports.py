"""The HTTP side of reconciliation: GETs provider usage reports (JSON) and vLLM
`/metrics` scrapes (text) for the importers in `gateway.accounting.importers`.

Importers take these as plain callables, so they never hold an HTTP client themselves
(clients live in `gateway/upstreams` only). No retries here: a report that cannot be
read fails the reconciliation loudly rather than comparing against half a report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from gateway.upstreams.sessions import new_session, proxy_for, read_bounded

QueryValue = str | int | list[str]
BODY_EXCERPT = 300
MAX_REPORT_BYTES = 256 * 1024 * 1024
CONNECT_TIMEOUT_S = 10.0


class ProviderReportError(Exception):
    """A report request failed; the message names the URL and the provider's answer,
    never the key."""


class ProviderReportClient:
    """Blocking calls (reconciliation is a batch job; the admin API runs it in a worker
    thread) over the same aiohttp sessions as model traffic, on an event loop of its
    own. Use as a context manager, or call `close()`."""

    def __init__(self, api_key: str | None = None, timeout_s: float = 60.0, extra_headers: Mapping[str, str] | None = None) -> None:
        self._headers = {"accept": "application/json", **(extra_headers or {})}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._loop = asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None

    def json(self, url: str, params: Mapping[str, QueryValue]) -> dict[str, Any]:
        body = self._get(url, params)
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ProviderReportError(f"GET {url}: the answer is not JSON: {_excerpt(body)!r}") from None
        if not isinstance(parsed, dict):
            raise ProviderReportError(f"GET {url}: expected a JSON object, got {type(parsed).__name__}")
        return parsed

    def text(self, url: str) -> str:
        return self._get(url, {}).decode("utf-8", "replace")

    def _get(self, url: str, params: Mapping[str, QueryValue]) -> bytes:
        try:
            status, body = self._loop.run_until_complete(self._fetch(url, params))
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ProviderReportError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            raise ProviderReportError(f"GET {url}: HTTP {status}: {_excerpt(body)}")
        return body

    async def _fetch(self, url: str, params: Mapping[str, QueryValue]) -> tuple[int, bytes]:
        if self._session is None:
            self._session = new_session(max_connections=4, keepalive_s=30.0, connect_timeout_s=CONNECT_TIMEOUT_S,
                                        headers=self._headers)
        query = [(name, str(item)) for name, value in params.items()
                 for item in (value if isinstance(value, list) else [value])]
        async with self._session.get(url, params=query, timeout=self._timeout, proxy=proxy_for(url)) as response:
            body = await read_bounded(response, MAX_REPORT_BYTES,
                                      lambda: ProviderReportError(f"GET {url}: the report is over {MAX_REPORT_BYTES} bytes"))
            return response.status, body

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._session is not None:
            self._loop.run_until_complete(self._session.close())
            self._session = None
        self._loop.close()

    def __enter__(self) -> ProviderReportClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _excerpt(body: bytes) -> str:
    return body[:BODY_EXCERPT].decode("utf-8", "replace")
