"""The tool-result cache: results keyed by (cache scope, tool, version, canonical
arguments). Bumping a tool's `version` misses every old entry; invalidation drops the
tool's namespace in every scope at once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.caching.keys import SHARED_SCOPE, cache_key, canonical_arguments, tool_key, tool_namespace
from gateway.caching.store import CacheStore
from gateway.routing.policy import Tool


class ToolCache:
    def __init__(self, store: CacheStore, secret: bytes) -> None:
        self.store = store
        self._secret = secret

    def address(self, scope: str, name: str, tool: Tool, arguments: Any) -> tuple[str, str]:
        scope = SHARED_SCOPE if tool.scope == "shared" else scope
        digest = cache_key(self._secret, scope, name.encode() + b"\x00" + canonical_arguments(arguments))
        return tool_namespace(scope, name), tool_key(tool.version, digest)

    async def get(self, address: tuple[str, str]) -> bytes | None:
        return await self.store.get(*address)

    async def put(self, address: tuple[str, str], value: bytes, ttl_s: float) -> None:
        await self.store.set(address[0], address[1], value, ttl_s)

    async def invalidate(self, name: str, scopes: Iterable[str]) -> None:
        for scope in {*scopes, SHARED_SCOPE}:
            await self.store.delete_namespace(tool_namespace(scope, name))
