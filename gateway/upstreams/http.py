"""HTTP upstreams (any OpenAI-compatible API, and vLLM replicas), on one pooled httpx
client each. This is the only module that creates HTTP clients for model traffic."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.base import UpstreamReply


@dataclass(slots=True)
class _Replica:
    url: str
    in_flight: int = 0


@dataclass(slots=True)
class _Stream:
    status: int
    headers: dict[str, str]
    replica: str
    response: httpx.Response
    release: _Replica

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self.response.aiter_raw()

    async def aclose(self) -> None:
        # Closing the response closes the connection mid-stream, which is how a
        # vLLM server learns to abort the request.
        try:
            await self.response.aclose()
        finally:
            self.release.in_flight -= 1


class HttpUpstream:
    def __init__(self, name: str, config: UpstreamConfig) -> None:
        self.name = name
        self.kind: str = config.kind
        self.config = config
        self._replicas = [_Replica(url) for url in config.urls()]
        self._next = 0
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        if key:
            headers["authorization"] = f"Bearer {key}"
        self.secrets = tuple(s for s in (key,) if s)
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_connections=config.max_connections, max_keepalive_connections=config.max_connections,
                                keepalive_expiry=config.keepalive_s),
            http1=True,
            trust_env=False,
        )

    def _pick(self) -> _Replica:
        # Least in-flight requests; round-robin among ties so idle replicas share load.
        n = len(self._replicas)
        if n == 1:
            return self._replicas[0]
        start = self._next
        self._next = (start + 1) % n
        best = self._replicas[start]
        for i in range(1, n):
            cand = self._replicas[(start + i) % n]
            if cand.in_flight < best.in_flight:
                best = cand
        return best

    async def send(self, path: str, body: bytes, timeout_s: float) -> UpstreamReply:
        replica = self._pick()
        replica.in_flight += 1
        try:
            response = await self._client.post(replica.url + path, content=body, timeout=self._timeout(timeout_s))
            return UpstreamReply(response.status_code, dict(response.headers), response.content, replica.url)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"upstream `{self.name}` did not answer within {timeout_s:.1f}s") from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream `{self.name}` could not be reached: {type(exc).__name__}") from exc
        finally:
            replica.in_flight -= 1

    async def open_stream(self, path: str, body: bytes, timeout_s: float) -> _Stream:
        replica = self._pick()
        replica.in_flight += 1
        request = self._client.build_request("POST", replica.url + path, content=body, timeout=self._timeout(timeout_s))
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            replica.in_flight -= 1
            raise UpstreamTimeout(f"upstream `{self.name}` did not answer within {timeout_s:.1f}s") from exc
        except httpx.HTTPError as exc:
            replica.in_flight -= 1
            raise UpstreamError(f"upstream `{self.name}` could not be reached: {type(exc).__name__}") from exc
        return _Stream(response.status_code, dict(response.headers), replica.url, response, replica)

    def _timeout(self, timeout_s: float) -> httpx.Timeout:
        return httpx.Timeout(min(timeout_s, self.config.timeout_s), connect=min(timeout_s, self.config.connect_timeout_s))

    async def aclose(self) -> None:
        await self._client.aclose()

