"""Dashboard sessions: a token is good for its signer, until its expiry, unless signed
out; nothing about the admin key can be read from it."""

from __future__ import annotations

import asyncio

from gateway.ui.sessions import Revocations, SessionKeys

SECRET = b"s" * 32
NOW = 1_800_000_000.0


def test_only_the_admin_key_itself_matches() -> None:
    keys = SessionKeys(SECRET, "admin-key-1")
    assert keys.key_matches("admin-key-1")
    for wrong in ("", "admin-key-", "admin-key-1 ", "ADMIN-KEY-1", "admin-key-12"):
        assert not keys.key_matches(wrong), wrong


def test_a_token_holds_until_its_expiry_and_names_no_key() -> None:
    keys = SessionKeys(SECRET, "admin-key-1", ttl_s=3600)
    token = keys.issue(NOW)
    assert "admin-key-1" not in token
    session = keys.verify(token, NOW + 3599)
    assert session is not None and session.expires == NOW + 3600
    assert keys.verify(token, NOW + 3600) is None
    assert keys.issue(NOW) != token, "each sign-in is a session of its own"


def test_a_token_is_refused_if_altered_or_signed_for_another_key_or_secret() -> None:
    keys = SessionKeys(SECRET, "admin-key-1")
    token = keys.issue(NOW)
    version, expires, session_id, mac = token.split(".")
    forged = [
        f"{version}.{int(expires) + 86_400}.{session_id}.{mac}",  # a longer life
        f"{version}.{expires}.{session_id}x.{mac}",
        f"{version}.{expires}.{session_id}.{mac[:-1]}",
        f"v2.{expires}.{session_id}.{mac}",
        "", "v1", "...", token + "." + mac, "x" * 500,
    ]
    for bad in forged:
        assert keys.verify(bad, NOW) is None, bad
    assert SessionKeys(SECRET, "admin-key-2").verify(token, NOW) is None, "a new admin key signs everyone out"
    assert SessionKeys(b"t" * 32, "admin-key-1").verify(token, NOW) is None
    assert SessionKeys(SECRET, "admin-key-1").verify(token, NOW) is not None, "another replica with the same secret accepts it"


def test_a_signed_out_session_stays_out_and_others_stay_in() -> None:
    keys = SessionKeys(SECRET, "admin-key-1")
    revocations = Revocations()
    mine, theirs = keys.verify(keys.issue(NOW), NOW), keys.verify(keys.issue(NOW), NOW)
    assert mine is not None and theirs is not None

    async def main() -> tuple[bool, bool]:
        await revocations.revoke(mine, NOW)
        return await revocations.revoked(mine), await revocations.revoked(theirs)

    assert asyncio.run(main()) == (True, False)
