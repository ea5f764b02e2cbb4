"""`CacheStore` on Redis, shared by every gateway replica.

Layout (prefix `gw`, namespace `tool:{t:acme}:search`):

    gw:tool:{t:acme}:search#<key>     "<generation>:<value>", with a PX expiry
    gw:gen:tool:{t:acme}:search       the namespace's current generation (no expiry)

Invalidation writes a fresh random generation: one SET, O(1), atomic for every
replica, instead of SCAN+DEL over a keyspace that may be large. An entry is live only
while the generation stored in it equals the namespace's current one, so a read is one
MGET of both keys; the namespace's `{scope}` hash tag puts both in the same slot, which
keeps MGET and the write script legal on Redis Cluster and Valkey.

The generation is stored *in the value* rather than in the key so a read needs no
prior round trip and a write after invalidation overwrites the stale entry in place
instead of leaving it beside the new one until its TTL. Random generations (not a
counter) mean a lost generation key can never bring old entries back: a missing
generation matches no entry.
"""

from __future__ import annotations

import secrets
from typing import Any

import redis.asyncio as redis

from gateway.caching.store import check_namespace, check_ttl

# Reads the generation (creating it if missing) and writes the entry in one atomic step,
# so an entry is never stamped with a generation that an invalidation already replaced.
_SET_SCRIPT = """
local generation = redis.call('GET', KEYS[1])
if not generation then
  generation = ARGV[3]
  redis.call('SET', KEYS[1], generation)
end
redis.call('SET', KEYS[2], generation .. ':' .. ARGV[1], 'PX', ARGV[2])
return 1
"""


def _new_generation() -> str:
    return secrets.token_hex(8)


class RedisStore:
    """`delete_namespace` returns None: old entries are not counted, only orphaned."""

    def __init__(self, client: redis.Redis, prefix: str = "gw") -> None:
        if not prefix or "{" in prefix or "}" in prefix or "#" in prefix:
            raise ValueError(f"Redis key prefix {prefix!r} must be non-empty, without braces or '#'")
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("RedisStore needs a client with decode_responses=False: cached values are bytes")
        self._client = client
        self._prefix = prefix
        self._set_script = client.register_script(_SET_SCRIPT)

    def entry_key(self, namespace: str, key: str) -> str:
        return f"{self._prefix}:{namespace}#{key}"

    def generation_key(self, namespace: str) -> str:
        # Never collides with an entry key: those all contain '#', namespaces never do.
        return f"{self._prefix}:gen:{namespace}"

    async def get(self, namespace: str, key: str) -> bytes | None:
        check_namespace(namespace)
        generation, stored = await self._mget(self.generation_key(namespace), self.entry_key(namespace, key))
        if generation is None or stored is None:
            return None
        stamp = generation + b":"
        if not stored.startswith(stamp):
            return None  # written before the last invalidation
        return stored[len(stamp):]

    async def set(self, namespace: str, key: str, value: bytes, ttl_s: float) -> None:
        check_namespace(namespace)
        check_ttl(ttl_s)
        ttl_ms = max(1, round(ttl_s * 1000))
        await self._set_script(
            keys=[self.generation_key(namespace), self.entry_key(namespace, key)],
            args=[value, ttl_ms, _new_generation()],
        )

    async def delete_namespace(self, namespace: str) -> None:
        check_namespace(namespace)
        await self._client.set(self.generation_key(namespace), _new_generation())

    async def _mget(self, *keys: str) -> list[bytes | None]:
        values: list[Any] = await self._client.mget(keys)
        return [v if v is None else bytes(v) for v in values]
