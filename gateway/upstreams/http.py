"""HTTP upstreams (any OpenAI-compatible API, and vLLM replicas) on one aiohttp session
per upstream, made in `upstreams/sessions.py`: keep-alive pools per origin, TLS and
proxies as the policy and the environment say, bounded response heads.

This module bounds what comes back besides the head: a non-streamed body over
`max_response_bytes` is an `UpstreamReplyTooLarge` (never retried: it would be billed
again), and the request's deadline bounds everything, streams included."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from gateway.errors import ReplicaFailed, UpstreamBadReply, UpstreamError, UpstreamReplyTooLarge, UpstreamTimeout
from gateway.routing.policy import Upstream as UpstreamConfig
from gateway.upstreams.base import PoolRequest, StreamBroken, UpstreamReply, UpstreamStream
from gateway.upstreams.pool import Pool, Replica
from gateway.upstreams.sessions import MAX_FIELD_BYTES, MAX_HEADERS, TlsFiles, new_session, proxy_for, read_bounded

# A deadline counts as passed this close to it: the loop's timers round to milliseconds.
DEADLINE_SLACK_S = 0.005
PROBE_TIMEOUT_S = 2.0
MAX_PROBE_BYTES = 4 * 1024 * 1024


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
    release: Callable[[], None]
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
            self.release()


class HttpUpstream:
    """One upstream: a single endpoint, or for `kind: vllm` a pool of replicas whose
    choice is `pool.choose` (routing/replica_choice.py), never this client's."""

    def __init__(self, name: str, config: UpstreamConfig, pool: Pool | None = None) -> None:
        self.name = name
        self.kind: str = config.kind
        self.config = config
        key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
        self._headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if key:
            self._headers["authorization"] = f"Bearer {key}"
        self.secrets = tuple(s for s in (key,) if s)
        self.pool = pool if pool is not None or config.kind != "vllm" else Pool(name, config)
        url = config.urls()[0]
        self._endpoint = Replica(url, proxy_for(url))
        self.active = 0  # this object's requests in flight (a retired one closes once idle)
        self._idle = asyncio.Event()
        self._idle.set()
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

    def _pick(self, request: PoolRequest | None) -> Replica:
        # A pool counts its replicas' requests in flight itself (and may raise PoolSpill).
        replica = self.pool.choose(request) if self.pool is not None else self._endpoint
        self.active += 1
        self._idle.clear()
        return replica

    def _release(self, replica: Replica) -> None:
        if self.pool is not None:
            self.pool.finished(replica)
        self.active -= 1
        if self.active <= 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def _timed_out(self, timeout_s: float) -> UpstreamTimeout:
        return UpstreamTimeout(f"upstream `{self.name}` did not answer within {timeout_s:.1f}s")

    def _failed(self, exc: aiohttp.ClientError, replica: Replica) -> UpstreamError:
        if isinstance(exc, aiohttp.ClientResponseError):
            # The response head did not parse: malformed, or over the bounds in sessions.py.
            return UpstreamBadReply(f"upstream `{self.name}` sent a response head the gateway refuses "
                                    f"(malformed, more than {MAX_HEADERS} fields, or a field over {MAX_FIELD_BYTES} bytes)")
        # A replica that refuses, resets or vanishes is taken out; the request, which it
        # did not finish (vLLM aborts what loses its connection), can go to another.
        gone = isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError)
        if gone and self.pool is not None and self.pool.unreachable(replica, type(exc).__name__):
            return ReplicaFailed(f"a replica of upstream `{self.name}` failed: {type(exc).__name__}", replica.url)
        if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ClientProxyConnectionError):
            return UpstreamError(f"upstream `{self.name}` could not be reached: {type(exc).__name__}")
        return UpstreamError(f"upstream `{self.name}` failed: {type(exc).__name__}")

    def _answered(self, replica: Replica, status: int) -> None:
        if self.pool is not None:
            self.pool.answered(replica, status)

    def with_headers(self, headers: Mapping[str, str]) -> WithHeaders:
        """This upstream, sending `headers` too on each request (a client's protocol
        version, say), over the same connections."""
        return WithHeaders(self, dict(headers))

    async def send(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None, *,
                   headers: Mapping[str, str] | None = None) -> UpstreamReply:
        replica = self._pick(pool)
        seconds = min(timeout_s, self.config.timeout_s)
        max_bytes = self.config.max_response_bytes
        try:
            async with self._client().post(replica.url + path, data=body, proxy=replica.proxy, headers=headers,
                                           timeout=aiohttp.ClientTimeout(total=seconds)) as response:
                raw = await read_bounded(response, max_bytes, lambda: self._too_large(max_bytes))
                self._answered(replica, response.status)
                return UpstreamReply(response.status, _headers(response), raw, replica.url)
        except TimeoutError as exc:
            raise self._timed_out(timeout_s) from exc
        except aiohttp.ClientError as exc:
            raise self._failed(exc, replica) from exc
        finally:
            self._release(replica)

    def _too_large(self, limit: int) -> UpstreamReplyTooLarge:
        return UpstreamReplyTooLarge(f"upstream `{self.name}` sent an answer over the gateway's bound of {limit} bytes")

    async def open_stream(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None, *,
                          headers: Mapping[str, str] | None = None) -> UpstreamStream:
        replica = self._pick(pool)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        # The request's deadline bounds the whole stream, the upstream's own timeout
        # each gap between reads.
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_read=self.config.timeout_s)
        try:
            response = await self._client().post(replica.url + path, data=body, proxy=replica.proxy, headers=headers,
                                                 timeout=timeout)
        except BaseException as exc:
            self._release(replica)
            if isinstance(exc, TimeoutError):
                raise self._timed_out(timeout_s) from exc
            if isinstance(exc, aiohttp.ClientError):
                raise self._failed(exc, replica) from exc
            raise
        self._answered(replica, response.status)
        return HttpStream(response.status, _headers(response), replica.url, response, deadline, self.config.max_event_bytes,
                       lambda: self._release(replica))

    async def fetch_text(self, url: str) -> tuple[int, str]:
        """GET a replica's own endpoint (`/health`, `/metrics`) on this upstream's
        connections: (status, body), bounded in time and size."""
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with self._client().get(url, proxy=proxy_for(url), timeout=timeout) as response:
            raw = await read_bounded(response, MAX_PROBE_BYTES, lambda: UpstreamReplyTooLarge(f"{url} answered too much"))
            return response.status, raw.decode("utf-8", "replace")

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

    async def send(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None) -> UpstreamReply:
        return await self.upstream.send(path, body, timeout_s, pool, headers=self.headers)

    async def open_stream(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None) -> UpstreamStream:
        return await self.upstream.open_stream(path, body, timeout_s, pool, headers=self.headers)

    def with_headers(self, headers: Mapping[str, str]) -> WithHeaders:
        """The same upstream with these headers added to the caller's."""
        return WithHeaders(self.upstream, {**self.headers, **headers})

    async def aclose(self) -> None:
        """The connections are the upstream's: closing a view of them closes nothing."""
