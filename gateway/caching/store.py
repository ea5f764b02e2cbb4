"""The `CacheStore` seam behind the response and tool-result caches, and its in-process
implementation: an LRU bounded by bytes, with per-entry TTLs.

Every entry lives in a *namespace* (`resp:{t:acme}`, `tool:{t:acme}:search`) and the
namespace must carry the tenant scope as a hash tag `{...}`: a store refuses an
unscoped namespace, so no caller can put an entry where two tenants could both read it.
Keys inside a namespace are opaque strings (the HMAC hex from `gateway.caching.keys`,
optionally prefixed, e.g. `v3:<hex>` for a tool version).

`delete_namespace` is how one tool's cache is invalidated (per scope); there is no
per-key delete because nothing on the request path needs one.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("gateway.cache")


class CacheStore(Protocol):
    async def get(self, namespace: str, key: str) -> bytes | None:
        """The live value, or None (absent, expired or invalidated)."""
        ...

    async def set(self, namespace: str, key: str, value: bytes, ttl_s: float) -> None:
        """Store `value` for `ttl_s` seconds (> 0). A store may drop it at once (too big)."""
        ...

    async def delete_namespace(self, namespace: str) -> int | None:
        """Make every entry of `namespace` unreachable, atomically for every reader.

        Returns how many entries were dropped, or None when the store invalidates
        without counting (Redis: old entries stay until their TTL, but never match).
        An entry written after the call, even if computed before it, stays readable.
        """
        ...


def check_namespace(namespace: str) -> None:
    """Refuse a namespace without a non-empty `{scope}` hash tag (or with a `#`, which
    the Redis store uses to separate namespace from key)."""
    start = namespace.find("{")
    end = namespace.find("}", start + 1)
    if start < 0 or end <= start + 1:
        raise ValueError(f"cache namespace {namespace!r} has no {{scope}} hash tag; every cache entry must be tenant-scoped")
    if "#" in namespace:
        raise ValueError(f"cache namespace {namespace!r} must not contain '#'")


def check_ttl(ttl_s: float) -> None:
    if not ttl_s > 0:  # also catches NaN
        raise ValueError(f"cache TTL must be > 0 seconds, got {ttl_s}")


@dataclass(slots=True)
class _Entry:
    value: bytes
    expires_at: float
    size: int


class MemoryStore:
    """LRU by total bytes of namespaces, keys and values; never holds more than `max_bytes`.

    get/set are O(1); delete_namespace is O(entries in that namespace), which frees
    their memory at once. Expired entries are dropped when read or when LRU reaches
    them; until then they count towards `size_bytes` and `len()`, but never exceed the
    bound. Single event loop only (no awaits inside, so each call is atomic there).
    """

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        # namespace -> its keys, so invalidating one tool does not scan the whole cache
        self._by_namespace: dict[str, set[str]] = {}
        self._size = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, namespace: str, key: str) -> bytes | None:
        check_namespace(namespace)
        entry = self._entries.get((namespace, key))
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            self._remove(namespace, key)
            return None
        self._entries.move_to_end((namespace, key))
        return entry.value

    async def set(self, namespace: str, key: str, value: bytes, ttl_s: float) -> None:
        check_namespace(namespace)
        check_ttl(ttl_s)
        if (namespace, key) in self._entries:
            self._remove(namespace, key)  # the old value is stale even if the new one does not fit
        size = len(namespace.encode()) + len(key.encode()) + len(value)
        if size > self.max_bytes:
            return
        while self._size + size > self.max_bytes:
            (old_namespace, old_key), _ = next(iter(self._entries.items()))
            self._remove(old_namespace, old_key)
        self._entries[(namespace, key)] = _Entry(value, self._clock() + ttl_s, size)
        self._by_namespace.setdefault(namespace, set()).add(key)
        self._size += size

    async def delete_namespace(self, namespace: str) -> int:
        check_namespace(namespace)
        keys = self._by_namespace.get(namespace)
        if not keys:
            return 0
        count = len(keys)
        for key in list(keys):
            self._remove(namespace, key)
        return count

    def _remove(self, namespace: str, key: str) -> None:
        entry = self._entries.pop((namespace, key))
        self._size -= entry.size
        keys = self._by_namespace[namespace]
        keys.discard(key)
        if not keys:
            del self._by_namespace[namespace]


class TolerantStore:
    """A shared cache that is down costs hits, never answers: errors from the wrapped
    store are logged and read as misses (get) or skipped (set, delete)."""

    def __init__(self, store: CacheStore) -> None:
        self._store = store

    async def get(self, namespace: str, key: str) -> bytes | None:
        try:
            return await self._store.get(namespace, key)
        except Exception as exc:
            log.warning("cache read failed, treating it as a miss: %s", exc)
            return None

    async def set(self, namespace: str, key: str, value: bytes, ttl_s: float) -> None:
        try:
            await self._store.set(namespace, key, value, ttl_s)
        except Exception as exc:
            log.warning("cache write failed, answer not cached: %s", exc)

    async def delete_namespace(self, namespace: str) -> int | None:
        return await self._store.delete_namespace(namespace)  # an operator's explicit request: let it fail loudly
