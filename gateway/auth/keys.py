"""API keys: minted here, stored in the policy only as `sha256:<hex>` digests.

A presented key is hashed and looked up by digest, then compared with
`hmac.compare_digest`; the lookup's timing depends only on the digest, which reveals
nothing usable about any stored key. A key found valid is remembered (in this process,
for the policy's life: at most one entry per key in the policy), so that its next
requests skip the hash: hashing is cheap when hot, but the first hash of a request,
with the CPU's caches cold from the wait between requests, cost ~18 us of a call's
path at one call at a time. The remembered keys are looked up in a dict whose string
hashing is keyed per process, so a presented key's timing still says nothing usable.
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
        self._known: dict[str, KeyOwner] = {}  # keys found valid; never more than the policy's

    def lookup(self, raw_key: str) -> KeyOwner | None:
        owner = self._known.get(raw_key)
        if owner is not None:
            return owner
        digest = key_digest(raw_key)
        found = self._owners.get(digest)
        if found is None or not hmac.compare_digest(found[0], digest):
            return None
        self._known[raw_key] = found[1]  # one key per digest: bounded by the policy's keys
        return found[1]
