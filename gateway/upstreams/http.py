"""HTTP upstreams (any OpenAI-compatible API, and vLLM replicas), on one pooled aiohttp
session each. This is the only module that creates HTTP clients for model traffic.

aiohttp rather than httpx: measured with bench/http_clients.py against the simulator,
httpx spent ~3.6 ms of CPU per request in the client and aiohttp ~0.4 ms, and the
client is on every upstream call."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.base import StreamBroken, UpstreamReply


@dataclass(slots=True)
class _Replica:
    url: str
    in_flight: int = 0


@dataclass(slots=True)
class _Stream:
    status: int
    headers: dict[str, str]
    replica: str
    response: aiohttp.ClientResponse
    release: _Replica

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise StreamBroken(type(exc).__name__) from exc

    async def aclose(self) -> None:
        try:
            if self.response.content.at_eof():
                self.response.release()  # complete: the connection goes back to the pool
            else:
                # Closing mid-stream drops the connection, which is how a vLLM server
                # learns to abort the request.
                self.response.close()
        finally:
            self.release.in_flight -= 1


def _headers(response: aiohttp.ClientResponse) -> dict[str, str]:
    return {k.lower(): v for k, v in response.headers.items()}


class HttpUpstream:
    def __init__(self, name: str, config: UpstreamConfig) -> None:
        self.name = name
        self.kind: str = config.kind
        self.config = config
        self._replicas = [_Replica(url) for url in config.urls()]
        self._next = 0
        self._headers = {"content-type": "application/json", "accept-encoding": "identity"}
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        if key:
            self._headers["authorization"] = f"Bearer {key}"
        self.secrets = tuple(s for s in (key,) if s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use, inside the running event loop it belongs to.
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.config.max_connections, keepalive_timeout=self.config.keepalive_s,
                                             ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers, auto_decompress=False,
                                                  trust_env=False, skip_auto_headers=("User-Agent",))
        return self._session

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

    def _timeout(self, timeout_s: float, streaming: bool) -> aiohttp.ClientTimeout:
        limit = min(timeout_s, self.config.timeout_s)
        connect = min(timeout_s, self.config.connect_timeout_s)
        # A stream is bounded by the gap between chunks; the request deadline bounds the rest.
        return aiohttp.ClientTimeout(total=None if streaming else limit, sock_connect=connect, sock_read=limit)

    async def send(self, path: str, body: bytes, timeout_s: float) -> UpstreamReply:
        replica = self._pick()
        replica.in_flight += 1
        try:
            async with self._client().post(replica.url + path, data=body, timeout=self._timeout(timeout_s, False)) as response:
                raw = await response.read()
                return UpstreamReply(response.status, _headers(response), raw, replica.url)
        except TimeoutError as exc:
            raise UpstreamTimeout(f"upstream `{self.name}` did not answer within {timeout_s:.1f}s") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"upstream `{self.name}` could not be reached: {type(exc).__name__}") from exc
        finally:
            replica.in_flight -= 1

    async def open_stream(self, path: str, body: bytes, timeout_s: float) -> _Stream:
        replica = self._pick()
        replica.in_flight += 1
        try:
            response = await self._client().post(replica.url + path, data=body, timeout=self._timeout(timeout_s, True))
        except TimeoutError as exc:
            replica.in_flight -= 1
            raise UpstreamTimeout(f"upstream `{self.name}` did not answer within {timeout_s:.1f}s") from exc
        except aiohttp.ClientError as exc:
            replica.in_flight -= 1
            raise UpstreamError(f"upstream `{self.name}` could not be reached: {type(exc).__name__}") from exc
        except BaseException:
            replica.in_flight -= 1
            raise
        return _Stream(response.status, _headers(response), replica.url, response, replica)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
