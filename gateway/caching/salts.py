"""Tenant-scoped prefix-cache steering values, derived from the gateway secret.

vLLM mixes `cache_salt` into the first KV block's hash, so requests with different
salts never share cached blocks: one salt per tenant scope isolates tenants while
keeping each tenant's own prefix hits.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path


def load_or_create_secret(configured: str | None, var_dir: Path) -> bytes:
    """GATEWAY_SECRET when set; else a random one kept under var/ so salts (and the
    cache hits they allow) survive restarts of a single-node gateway."""
    if configured:
        return configured.encode("utf-8")
    path = var_dir / "gateway-secret"
    if path.exists():
        return path.read_bytes()
    var_dir.mkdir(parents=True, exist_ok=True)
    value = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(value)
    return value


class TenantSalts:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._salts: dict[str, str] = {}

    def derive(self, purpose: str, scope: str) -> str:
        digest = hmac.new(self._secret, f"{purpose}\x00{scope}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def cache_salt(self, scope: str) -> str:
        return self._memo("vllm-cache-salt", scope)

    def prompt_cache_tag(self, scope: str) -> str:
        return self._memo("prompt-cache-key", scope)[:16]

    def _memo(self, purpose: str, scope: str) -> str:
        # One HMAC per (purpose, scope) for the life of the process, not one per request.
        key = f"{purpose}\x00{scope}"
        salt = self._salts.get(key)
        if salt is None:
            salt = self._salts[key] = self.derive(purpose, scope)
        return salt
