"""The seam between the pipeline and providers: one small interface per upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson


class StreamBroken(Exception):
    """The upstream's connection failed mid-stream (reset, truncated body, read timeout),
    or `deadline`: the stream's time ran out (the upstream was dropped for it)."""

    def __init__(self, reason: str, *, deadline: bool = False) -> None:
        super().__init__(reason)
        self.deadline = deadline


@dataclass(frozen=True, slots=True)
class PoolRequest:
    """What a self-hosted pool needs to place a request on a replica (upstreams of other
    kinds are sent none): the prompt as the replica will prefill it, the tenant's
    `cache_salt`, the deadline, and whether the model has a fallback to spill to."""

    tenant: str
    prompt: str
    salt: str
    deadline: float  # monotonic
    can_spill: bool = False


@dataclass(slots=True)
class UpstreamReply:
    status: int
    headers: dict[str, str]
    body: bytes
    replica: str

    def translated(self, translate: Callable[[dict[str, Any]], dict[str, Any]]) -> UpstreamReply:
        """This 200 answer in another dialect: its JSON object through `translate`. An
        answer that is not a JSON object comes back as it came, for the pipeline to
        report as malformed."""
        try:
            answer = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return self
        if not isinstance(answer, dict):
            return self
        return UpstreamReply(self.status, self.headers, orjson.dumps(translate(answer)), self.replica)


class UpstreamStream(Protocol):
    status: int
    headers: dict[str, str]
    replica: str
    max_event_bytes: int  # the bound on one event of this stream

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None:
        """End the stream; one not read to its end drops the connection, which is how a
        vLLM server learns to abort the request."""


class Upstream(Protocol):
    name: str
    kind: str
    secrets: tuple[str, ...]  # credential values to scrub from any message we relay

    async def send(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None) -> UpstreamReply:
        """The whole reply, within `timeout_s` (enforced here: the pipeline sets no timer
        of its own around it), else UpstreamTimeout. A pool may instead raise PoolSpill."""
        ...

    async def open_stream(self, path: str, body: bytes, timeout_s: float, pool: PoolRequest | None = None) -> UpstreamStream:
        """The reply's status and headers, then its body as it arrives, all within
        `timeout_s` (enforced here, as for `send`): past it the connection is dropped and
        `aiter_raw` raises StreamBroken with `deadline` set, or this raises UpstreamTimeout."""
        ...

    def with_headers(self, headers: Mapping[str, str]) -> Upstream:
        """This upstream, sending `headers` too on each request (a client's protocol
        version, say), over the same connections."""
        ...

    async def aclose(self) -> None: ...


class UpstreamSource(Protocol):
    """Where the pipeline finds the upstream a policy names (upstreams/registry.py)."""

    def get(self, name: str) -> Upstream: ...
