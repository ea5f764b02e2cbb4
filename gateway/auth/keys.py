"""API keys: minted here, stored in the policy only as `sha256:<hex>` digests.

A presented key is hashed and looked up by digest, then compared with
`hmac.compare_digest`; the lookup's timing depends only on the digest, which reveals
nothing usable about any stored key. Raw keys are never kept, not even in memory.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

KEY_PREFIX = "sk-gw-"


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_digest(raw_key: str) -> str:
    return "sha256:" + hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def key_id(digest: str) -> str:
    """A short, stable, non-secret id for ledgers and logs."""
    return "key_" + digest.removeprefix("sha256:")[:12]


def bearer_matches(authorization: str, expected: str) -> bool:
    """Whether an `Authorization` header carries `Bearer <expected>` (an operator's
    token: the admin key, the metrics key). Compares digests in constant time, so
    neither the token's characters nor its length show in the timing."""
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(hashlib.sha256(presented.strip().encode()).digest(), hashlib.sha256(expected.encode()).digest())


@dataclass(frozen=True, slots=True)
class KeyOwner:
    tenant: str
    key_id: str


class KeyIndex:
    def __init__(self, digests_by_tenant: dict[str, list[str]]) -> None:
        self._owners: dict[str, tuple[str, KeyOwner]] = {}
        for tenant, digests in digests_by_tenant.items():
            for digest in digests:
                self._owners[digest] = (digest, KeyOwner(tenant, key_id(digest)))

    def lookup(self, raw_key: str) -> KeyOwner | None:
        digest = key_digest(raw_key)
        found = self._owners.get(digest)
        if found is None or not hmac.compare_digest(found[0], digest):
            return None
        return found[1]
