"""Prefix-cache steering: every request to a provider's or vLLM's prefix cache carries a
value scoped to the tenant's cache scope, so tenants never share cached blocks while
each tenant keeps its own hits. Client-sent values are replaced or namespaced."""

from __future__ import annotations

from typing import Any

from gateway.caching.salts import TenantSalts

VLLM_ONLY_FIELDS = ("cache_salt",)
MAX_PROMPT_CACHE_KEY = 64  # OpenAI's limit on prompt_cache_key length


def steer(body: dict[str, Any], upstream_kind: str, scope: str, salts: TenantSalts, send_prompt_cache_key: bool) -> None:
    """Patch `body` in place for an upstream of `upstream_kind`."""
    if upstream_kind == "vllm":
        # vLLM mixes the salt into the first KV block's hash: a client may not pick it.
        body["cache_salt"] = salts.cache_salt(scope)
        return
    for name in VLLM_ONLY_FIELDS:
        body.pop(name, None)
    if send_prompt_cache_key:
        body["prompt_cache_key"] = prompt_cache_key(salts, scope, body.get("prompt_cache_key"))


def prompt_cache_key(salts: TenantSalts, scope: str, client_value: Any) -> str:
    """`<tenant tag>` or `<tenant tag>:<client's key>`: the tag is derived from the
    gateway secret, so one tenant cannot aim at another tenant's cache routing."""
    tag = salts.prompt_cache_tag(scope)
    if not isinstance(client_value, str) or not client_value:
        return tag
    return f"{tag}:{client_value}"[:MAX_PROMPT_CACHE_KEY]
