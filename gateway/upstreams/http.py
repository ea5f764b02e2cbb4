"""HTTP upstreams (any OpenAI-compatible API, and vLLM replicas) on one aiohttp session
per upstream, made in `upstreams/sessions.py`: keep-alive pools per origin, TLS and
proxies as the policy and the environment say, bounded response heads.

This module bounds what comes back besides the head: a non-streamed body over
`max_response_bytes` is an `UpstreamReplyTooLarge` (never retried: it would be billed
again), and the request's deadline bounds everything, streams included."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import aiohttp

from gateway.errors import UpstreamBadReply, UpstreamError, UpstreamReplyTooLarge, UpstreamTimeout
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.base import StreamBroken, UpstreamReply
from gateway.upstreams.sessions import MAX_FIELD_BYTES, MAX_HEADERS, TlsFiles, new_session, proxy_for, read_bounded

# A deadline counts as passed this close to it: the loop's timers round to milliseconds.
DEADLINE_SLACK_S = 0.005


@dataclass(slots=True)
class _Replica:
    url: str
    proxy: str | None
    in_flight: int = 0


def _headers(response: aiohttp.ClientResponse) -> dict[str, str]:
    """Lower-cased names; a repeated field's values joined with commas, as HTTP allows."""
    values: dict[str, list[str]] = {}
    for name, value in response.headers.items():
        values.setdefault(name.lower(), []).append(value)
    return {name: ", ".join(parts) for name, parts in values.items()}


@dataclass(slots=True)
class HttpStream:
    status: int
    headers: dict[str, str]
    replica: str
    response: aiohttp.ClientResponse
    deadline: float
    max_event_bytes: int
    release: _Replica
    _closed: bool = field(default=False)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            passed = asyncio.get_running_loop().time() >= self.deadline - DEADLINE_SLACK_S
            raise StreamBroken(type(exc).__name__, deadline=passed) from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.response.content.at_eof():
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
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        self._headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if key:
            self._headers["authorization"] = f"Bearer {key}"
        self.secrets = tuple(s for s in (key,) if s)
        self._replicas = [_Replica(url, proxy_for(url)) for url in config.urls()]
        self._next = 0
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use, inside the event loop that will use it.
        if self._session is None:
            config = self.config
            self._session = new_session(
                max_connections=config.max_connections, keepalive_s=config.keepalive_s,
                connect_timeout_s=config.connect_timeout_s, headers=self._headers,
                tls=TlsFiles(config.ca_bundle, config.client_cert, config.client_key))
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

    def _timed_out(self, timeout_s: float) -> UpstreamTimeout:
        return UpstreamTimeout(f"upstream `{self.name}` did not answer within {timeout_s:.1f}s")

    def _failed(self, exc: aiohttp.ClientError) -> UpstreamError:
        if isinstance(exc, aiohttp.ClientResponseError):
            # The response head did not parse: malformed, or over the bounds in sessions.py.
            return UpstreamBadReply(f"upstream `{self.name}` sent a response head the gateway refuses "
                                    f"(malformed, more than {MAX_HEADERS} fields, or a field over {MAX_FIELD_BYTES} bytes)")
        if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ClientProxyConnectionError):
            return UpstreamError(f"upstream `{self.name}` could not be reached: {type(exc).__name__}")
        return UpstreamError(f"upstream `{self.name}` failed: {type(exc).__name__}")

    def with_headers(self, headers: Mapping[str, str]) -> WithHeaders:
        """This upstream, sending `headers` too on each request (a client's protocol
        version, say), over the same pool."""
        return WithHeaders(self, dict(headers))

    async def send(self, path: str, body: bytes, timeout_s: float, headers: Mapping[str, str] | None = None) -> UpstreamReply:
        replica = self._pick()
        replica.in_flight += 1
        seconds = min(timeout_s, self.config.timeout_s)
        max_bytes = self.config.max_response_bytes
        try:
            async with self._client().post(replica.url + path, data=body, proxy=replica.proxy, headers=headers,
                                           timeout=aiohttp.ClientTimeout(total=seconds)) as response:
                raw = await read_bounded(response, max_bytes, lambda: self._too_large(max_bytes))
                return UpstreamReply(response.status, _headers(response), raw, replica.url)
        except TimeoutError as exc:
            raise self._timed_out(timeout_s) from exc
        except aiohttp.ClientError as exc:
            raise self._failed(exc) from exc
        finally:
            replica.in_flight -= 1

    def _too_large(self, limit: int) -> UpstreamReplyTooLarge:
        return UpstreamReplyTooLarge(f"upstream `{self.name}` sent an answer over the gateway's bound of {limit} bytes")

    async def open_stream(self, path: str, body: bytes, timeout_s: float,
                          headers: Mapping[str, str] | None = None) -> HttpStream:
        replica = self._pick()
        replica.in_flight += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        # The request's deadline bounds the whole stream, the upstream's own timeout
        # each gap between reads.
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_read=self.config.timeout_s)
        try:
            response = await self._client().post(replica.url + path, data=body, proxy=replica.proxy, headers=headers,
                                                 timeout=timeout)
        except BaseException as exc:
            replica.in_flight -= 1
            if isinstance(exc, TimeoutError):
                raise self._timed_out(timeout_s) from exc
            if isinstance(exc, aiohttp.ClientError):
                raise self._failed(exc) from exc
            raise
        return HttpStream(response.status, _headers(response), replica.url, response, deadline, self.config.max_event_bytes, replica)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class WithHeaders:
    """An `Upstream` that is an HttpUpstream plus request headers of the caller's."""

    def __init__(self, upstream: HttpUpstream, headers: dict[str, str]) -> None:
        self.upstream = upstream
        self.headers = headers
        self.name, self.kind, self.secrets = upstream.name, upstream.kind, upstream.secrets

    async def send(self, path: str, body: bytes, timeout_s: float) -> UpstreamReply:
        return await self.upstream.send(path, body, timeout_s, self.headers)

    async def open_stream(self, path: str, body: bytes, timeout_s: float) -> HttpStream:
        return await self.upstream.open_stream(path, body, timeout_s, self.headers)

    async def aclose(self) -> None:
        """The pool is the upstream's: closing a view of it closes nothing."""
