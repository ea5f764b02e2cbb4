"""HTTP upstreams (any OpenAI-compatible API, and vLLM replicas), on one keep-alive
connection pool per replica. This is the only module that creates HTTP clients for
model traffic.

The client is our own HTTP/1.1 pool (upstreams/h1.py): measured with
bench/http_clients.py against the simulator, client CPU per request was ~3.6 ms for
httpx, ~0.45 ms for aiohttp and ~0.19 ms for h1, and the client is on every upstream
call."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.base import StreamBroken, UpstreamReply
from gateway.upstreams.h1 import H1DeadlinePassed, H1Error, H1Pool, H1Response


@dataclass(slots=True)
class _Replica:
    url: str
    pool: H1Pool
    in_flight: int = 0


@dataclass(slots=True)
class _Stream:
    status: int
    headers: dict[str, str]
    replica: str
    response: H1Response
    release: _Replica
    _closed: bool = field(default=False)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.iter_raw():
                yield chunk
        except (TimeoutError, H1Error) as exc:
            raise StreamBroken(type(exc).__name__, deadline=isinstance(exc, H1DeadlinePassed)) from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.response.at_eof:
                self.response.release()  # complete: the connection goes back to the pool
            else:
                # Closing mid-stream drops the connection, which is how a vLLM server
                # learns to abort the request.
                self.response.close()
        finally:
            self.release.in_flight -= 1


class HttpUpstream:
    def __init__(self, name: str, config: UpstreamConfig) -> None:
        self.name = name
        self.kind: str = config.kind
        self.config = config
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        if key:
            headers["authorization"] = f"Bearer {key}"
        self.secrets = tuple(s for s in (key,) if s)
        self._replicas = [
            _Replica(url, H1Pool(url, default_headers=headers, max_connections=config.max_connections,
                                 keepalive_s=config.keepalive_s, connect_timeout_s=config.connect_timeout_s))
            for url in config.urls()
        ]
        self._next = 0

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

    def _limit(self, timeout_s: float) -> float:
        return min(timeout_s, self.config.timeout_s)

    def _timed_out(self, timeout_s: float) -> UpstreamTimeout:
        return UpstreamTimeout(f"upstream `{self.name}` did not answer within {timeout_s:.1f}s")

    def _unreachable(self, exc: Exception) -> UpstreamError:
        return UpstreamError(f"upstream `{self.name}` could not be reached: {type(exc).__name__}")

    async def send(self, path: str, body: bytes, timeout_s: float) -> UpstreamReply:
        replica = self._pick()
        replica.in_flight += 1
        limit = self._limit(timeout_s)
        try:
            response = await replica.pool.request("POST", path, body, timeout_s=limit)
            raw = await response.read()
            return UpstreamReply(response.status, response.headers, raw, replica.url)
        except TimeoutError as exc:
            raise self._timed_out(timeout_s) from exc
        except H1Error as exc:
            raise self._unreachable(exc) from exc
        finally:
            replica.in_flight -= 1

    async def open_stream(self, path: str, body: bytes, timeout_s: float) -> _Stream:
        replica = self._pick()
        replica.in_flight += 1
        try:
            # The request's deadline bounds the whole stream (the pool's one timer: no
            # timeout scope of the caller's), the upstream's own timeout each gap between chunks.
            response = await replica.pool.request("POST", path, body, timeout_s=timeout_s,
                                                  read_timeout_s=self._limit(timeout_s))
        except BaseException as exc:
            replica.in_flight -= 1
            if isinstance(exc, TimeoutError):
                raise self._timed_out(timeout_s) from exc
            if isinstance(exc, H1Error):
                raise self._unreachable(exc) from exc
            raise
        return _Stream(response.status, response.headers, replica.url, response, replica)

    async def aclose(self) -> None:
        for replica in self._replicas:
            await replica.pool.aclose()
