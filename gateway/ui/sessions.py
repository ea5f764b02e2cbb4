"""Dashboard sessions: the admin key is checked once, at sign-in, and the browser then
holds a signed, expiring session token in an HttpOnly cookie - never the key itself.

A token is `v1.<expiry>.<id>.<mac>`: the expiry in Unix seconds, a random id, and an
HMAC-SHA256 of both under a key derived from the gateway secret and the admin key. So
any replica sharing the secret accepts it (and a restart keeps it), changing the admin
key signs everyone out, and nothing is stored per session. Signing out revokes the id
until its expiry: in Redis when the gateway has one (every replica sees it), else in
this process."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis

COOKIE = "gateway_ui_session"
DEFAULT_TTL_S = 8 * 3600  # a working day
VERSION = "v1"
MAX_TOKEN_LENGTH = 200


class SessionKeys:
    """Checks the admin key and issues and verifies session tokens."""

    def __init__(self, secret: bytes, admin_key: str, ttl_s: int = DEFAULT_TTL_S) -> None:
        self._admin_digest = hashlib.sha256(admin_key.encode()).digest()
        self._mac_key = hmac.new(secret, b"gateway-ui-session\x00" + admin_key.encode(), hashlib.sha256).digest()
        self.ttl_s = ttl_s

    def key_matches(self, presented: str) -> bool:
        """Constant time in the key's characters and length: digests are compared."""
        return hmac.compare_digest(hashlib.sha256(presented.encode()).digest(), self._admin_digest)

    def issue(self, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.ttl_s)
        body = f"{VERSION}.{expires}.{secrets.token_urlsafe(18)}"
        return f"{body}.{self._mac(body)}"

    def verify(self, token: str, now: float | None = None) -> Session | None:
        """The session a token names, if its signature holds and it has not expired."""
        if not token or len(token) > MAX_TOKEN_LENGTH:
            return None
        body, _, mac = token.rpartition(".")
        if not hmac.compare_digest(mac.encode(), self._mac(body).encode()):
            return None
        parts = body.split(".")
        if len(parts) != 3 or parts[0] != VERSION or not parts[1].isdigit():
            return None
        _, expires, session_id = parts
        session = Session(session_id, int(expires))
        return session if session.expires > (time.time() if now is None else now) else None

    def _mac(self, body: str) -> str:
        digest = hmac.new(self._mac_key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class Session:
    __slots__ = ("expires", "id")

    def __init__(self, session_id: str, expires: int) -> None:
        self.id = session_id
        self.expires = expires


class Revocations:
    """Session ids signed out before their expiry."""

    def __init__(self, redis: Redis | None = None, prefix: str = "gw") -> None:
        self._redis = redis
        self._prefix = prefix
        self._local: dict[str, int] = {}  # id -> expiry

    async def revoke(self, session: Session, now: float | None = None) -> None:
        moment = time.time() if now is None else now
        self._local = {sid: exp for sid, exp in self._local.items() if exp > moment}
        self._local[session.id] = session.expires
        if self._redis is not None:
            ttl = max(1, int(session.expires - moment))
            await self._redis.set(self._key(session.id), b"1", ex=ttl)

    async def revoked(self, session: Session) -> bool:
        if session.id in self._local:
            return True
        if self._redis is None:
            return False
        return bool(await self._redis.exists(self._key(session.id)))

    def _key(self, session_id: str) -> str:
        return f"{self._prefix}:ui:revoked:{session_id}"
