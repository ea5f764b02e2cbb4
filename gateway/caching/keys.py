"""What makes two requests "the same" for the caches, and the keys that name them.

A cache key is an HMAC of (scope, canonical request): the scope is part of the MAC
input and of the namespace, so byte-identical requests from two tenants never share
an entry; the key is a MAC rather than a plain hash so a key seen in Redis reveals
nothing about the prompt, and cannot be computed by anyone without the gateway secret.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

import orjson

# Fields that change how an answer is delivered or billed, never what it says.
TRANSPORT_FIELDS = frozenset({
    "model",  # replaced by the model actually routed to
    "stream",
    "stream_options",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "cache_salt",
    "metadata",
    "store",
    "service_tier",
})

# Numbers where 0 and 0.0 must mean the same request.
_FLOAT_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
# Whole floats below this are written as the integer they equal; larger ones stay floats
# (1e308 as an int is past the 64 bits orjson writes).
_EXACT_INTS = 2.0**53

SHARED_SCOPE = "shared"


def tenant_scope(tenant: str) -> str:
    """The scope of a tenant's private entries; prefixed so that a tenant named
    `shared` can never land in the cache scope of public (shared) tool results."""
    return f"t:{tenant}"


def response_namespace(scope: str) -> str:
    return f"resp:{{{_checked_scope(scope)}}}"


def tool_namespace(scope: str, tool: str) -> str:
    """One tool's entries in one scope: the unit `CacheStore.delete_namespace` drops.
    Put the tool version in the key (`tool_key`) so a version bump also misses."""
    if not tool or any(c in tool for c in "{}#"):
        raise ValueError(f"tool name {tool!r} must be non-empty, without braces or '#'")
    return f"tool:{{{_checked_scope(scope)}}}:{tool}"


def tool_key(version: str, digest: str) -> str:
    return f"{version}:{digest}"


def canonical_request(endpoint: str, model: str, body: Mapping[str, Any]) -> bytes:
    """Compact JSON, keys sorted at every level, of everything that can change the answer.

    Unknown fields are kept: a field we do not know may well change the answer, and a
    needless miss is cheap while a wrong hit is not.
    """
    form: dict[str, Any] = {name: value for name, value in body.items() if name not in TRANSPORT_FIELDS}
    for name in _FLOAT_FIELDS:
        value = form.get(name)
        if isinstance(value, float) and value.is_integer() and abs(value) < _EXACT_INTS:
            form[name] = int(value)
    form["model"] = model
    form["endpoint"] = endpoint
    return orjson.dumps(form, option=orjson.OPT_SORT_KEYS)


def canonical_arguments(args: Any) -> bytes:
    """Tool arguments in canonical JSON; a JSON string (as in OpenAI `tool_calls`) is
    parsed first, so `'{"b":1, "a":2}'` and `{"a": 2, "b": 1}` give the same bytes."""
    if isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            # Malformed arguments stay distinct from the JSON string with the same text.
            return b"raw:" + orjson.dumps(args)
    return orjson.dumps(args, option=orjson.OPT_SORT_KEYS)


def cache_key(secret: bytes, scope: str, canonical: bytes) -> str:
    """Hex HMAC-SHA256 over scope NUL canonical (canonical JSON never contains a NUL,
    so the split is unambiguous)."""
    message = _checked_scope(scope).encode() + b"\x00" + canonical
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def is_deterministic(body: Mapping[str, Any]) -> bool:
    """temperature 0 or a seed. No temperature means the provider's default (1 on
    OpenAI, often above 0 on vLLM): sampled, not worth replaying unless asked."""
    temperature = body.get("temperature")
    if _is_number(temperature) and temperature == 0:
        return True
    return body.get("seed") is not None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked_scope(scope: str) -> str:
    if not scope or any(c in scope for c in "{}#\x00"):
        raise ValueError(f"cache scope {scope!r} must be non-empty, without braces, '#' or NUL")
    return scope
