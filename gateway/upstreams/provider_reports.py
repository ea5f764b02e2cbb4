"""The HTTP side of reconciliation: GETs provider usage reports (JSON) and vLLM
`/metrics` scrapes (text) for the importers in `gateway.accounting.importers`.

Importers take these as plain callables, so they never hold an HTTP client themselves
(clients live in `gateway/upstreams` only). No retries here: a report that cannot be
read fails the reconciliation loudly rather than comparing against half a report.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx

QueryValue = str | int | list[str]
BODY_EXCERPT = 300


class ProviderReportError(Exception):
    """A report request failed; the message names the URL and the provider's answer,
    never the key."""


class ProviderReportClient:
    """Sync (reconciliation is a batch job; the admin API runs it in a worker thread).
    Use as a context manager, or call `close()`."""

    def __init__(self, api_key: str | None = None, timeout_s: float = 60.0, extra_headers: Mapping[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"accept": "application/json", **(extra_headers or {})}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=10.0), trust_env=False,
                                    transport=transport)

    def json(self, url: str, params: Mapping[str, QueryValue]) -> dict[str, Any]:
        response = self._get(url, params)
        try:
            body = response.json()
        except ValueError:
            raise ProviderReportError(f"GET {url}: the answer is not JSON: {response.text[:BODY_EXCERPT]!r}") from None
        if not isinstance(body, dict):
            raise ProviderReportError(f"GET {url}: expected a JSON object, got {type(body).__name__}")
        return body

    def text(self, url: str) -> str:
        return self._get(url, {}).text

    def _get(self, url: str, params: Mapping[str, QueryValue]) -> httpx.Response:
        try:
            response = self._client.get(url, params=dict(params))
        except httpx.HTTPError as exc:
            raise ProviderReportError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ProviderReportError(f"GET {url}: HTTP {response.status_code}: {response.text[:BODY_EXCERPT]}")
        return response

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ProviderReportClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
