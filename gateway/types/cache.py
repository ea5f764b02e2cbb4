"""A request's response-cache decision and a cached answer (caching/response_cache.py
makes them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class CachePlan:
    status: str  # what the response will say in x-gateway-cache
    lookup: bool = False
    store: bool = False
    namespace: str = ""
    key: str = ""
    ttl_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    model: str
    upstream: str
    usage: dict[str, Any] | None
    body: bytes  # the upstream's JSON answer, byte for byte
