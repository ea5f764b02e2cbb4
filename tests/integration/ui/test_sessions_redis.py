"""Signing out of the dashboard on one replica signs the session out on the others
when they share Redis (real Redis)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.ui.sessions import Revocations, SessionKeys


@pytest.mark.services
def test_a_sign_out_on_one_replica_holds_on_another(redis_prefix: tuple[str, str]) -> None:
    from redis.asyncio import Redis

    url, prefix = redis_prefix
    keys = SessionKeys(b"s" * 32, "admin-key")
    now = 1_800_000_000.0
    session, other = keys.verify(keys.issue(now), now), keys.verify(keys.issue(now), now)
    assert session is not None and other is not None

    async def main() -> tuple[bool, bool, int]:
        one, two = Redis.from_url(url), Redis.from_url(url)
        try:
            await Revocations(one, prefix).revoke(session, now)
            elsewhere = Revocations(two, prefix)
            ttl = await two.ttl(f"{prefix}:ui:revoked:{session.id}")
            return await elsewhere.revoked(session), await elsewhere.revoked(other), ttl
        finally:
            await one.aclose()
            await two.aclose()

    revoked, untouched, ttl = asyncio.run(main())
    assert revoked and not untouched
    assert 0 < ttl <= keys.ttl_s, "the revocation lasts as long as the session would have"
