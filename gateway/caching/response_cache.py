"""The tenant-scoped response cache: which requests may use it, under which key, and
what an entry holds. Keys are keyed hashes of the canonical request *and* the tenant's
cache scope, so byte-identical requests from two tenants can never meet."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.caching.keys import cache_key, canonical_request, is_deterministic, response_namespace, tenant_scope
from gateway.caching.store import CacheStore
from gateway.routing.resolved import ModelTarget, RuntimePolicy
from gateway.types.cache import CachedAnswer, CachePlan

MAX_ENTRY_BYTES = 4 * 1024 * 1024
HIT, MISS, BYPASS = "hit", "miss", "bypass"


def cache_scope(policy: RuntimePolicy, tenant: str) -> str:
    """A tenant's own scope, or its named sharing group's."""
    settings = policy.policy.tenants[tenant].cache
    return f"g:{settings.group}" if settings is not None and settings.group else tenant_scope(tenant)


class ResponseCache:
    def __init__(self, store: CacheStore, secret: bytes) -> None:
        self.store = store
        self._secret = secret

    def plan(self, endpoint: str, tenant: str, target: ModelTarget, body: Mapping[str, Any], policy: RuntimePolicy,
             cache_control: str) -> CachePlan:
        tenant_cfg = policy.policy.tenants[tenant].cache
        defaults = policy.policy.defaults
        if (tenant_cfg is not None and tenant_cfg.enabled is False) or policy.policy.models[target.name].cache is False:
            return CachePlan(BYPASS)
        opted_in = policy.policy.models[target.name].cache is True or (tenant_cfg is not None and tenant_cfg.enabled is True)
        if not (endpoint == "embeddings" or is_deterministic(body) or opted_in or defaults.cache_nondeterministic):
            return CachePlan(BYPASS)
        ttl = tenant_cfg.response_ttl_s if tenant_cfg is not None and tenant_cfg.response_ttl_s is not None else defaults.response_cache_ttl_s
        directives = {d.strip().lower() for d in cache_control.split(",")}
        lookup, store = "no-cache" not in directives, "no-store" not in directives and ttl > 0
        if not (lookup or store):
            return CachePlan(BYPASS)
        scope = cache_scope(policy, tenant)
        key = cache_key(self._secret, scope, canonical_request(endpoint, target.name, body))
        return CachePlan(MISS, lookup, store, response_namespace(scope), key, ttl)

    async def lookup(self, plan: CachePlan) -> CachedAnswer | None:
        if not plan.lookup:
            return None
        raw = await self.store.get(plan.namespace, plan.key)
        if raw is None:
            return None
        meta_len = int.from_bytes(raw[:4], "big")
        meta = orjson.loads(raw[4 : 4 + meta_len])
        return CachedAnswer(meta["model"], meta["upstream"], meta.get("usage"), raw[4 + meta_len :])

    async def save(self, plan: CachePlan, target: ModelTarget, body: Mapping[str, Any], raw: bytes) -> bool:
        """Store a complete answer; errors and truncated answers are never stored."""
        if not plan.store or len(raw) > MAX_ENTRY_BYTES or not complete(body):
            return False
        meta = orjson.dumps({"model": target.name, "upstream": target.upstream, "usage": body.get("usage")})
        await self.store.set(plan.namespace, plan.key, len(meta).to_bytes(4, "big") + meta + raw, plan.ttl_s)
        return True


def complete(body: Mapping[str, Any]) -> bool:
    """An answer worth replaying: no error, and every choice finished on its own terms."""
    if "error" in body:
        return False
    if body.get("object") == "list":  # embeddings
        return bool(body.get("data"))
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    return all(isinstance(c, dict) and c.get("finish_reason") in ("stop", "tool_calls", "function_call") for c in choices)
