from __future__ import annotations

import pytest

from gateway.auth.keys import KeyIndex, bearer_matches, key_digest, new_api_key
from gateway.cli import main as cli_main


def test_minted_key_is_found_only_by_its_digest() -> None:
    key = new_api_key()
    index = KeyIndex({"acme": [key_digest(key)]})
    owner = index.lookup(key)
    assert owner is not None and owner.tenant == "acme"
    assert owner.key_id.startswith("key_") and key not in owner.key_id
    assert index.lookup(key + "x") is None
    assert index.lookup(key_digest(key)) is None  # the digest itself is not a key


def test_a_key_used_before_is_found_again_and_near_misses_still_are_not() -> None:
    acme, other = new_api_key(), new_api_key()
    index = KeyIndex({"acme": [key_digest(acme)], "other": [key_digest(other)]})
    first = index.lookup(acme)
    assert first is not None and index.lookup(acme) == first
    assert index.lookup(acme[:-1]) is None and index.lookup(acme + " ") is None and index.lookup(acme.upper()) is None
    found = index.lookup(other)
    assert found is not None and found.tenant == "other" and index.lookup(other) == found
    assert KeyIndex({"other": [key_digest(other)]}).lookup(acme) is None  # a policy without the key refuses it


def test_keys_new_prints_key_and_policy_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["keys", "new", "--tenant", "acme"]) == 0
    out = capsys.readouterr().out
    key = next(line.strip() for line in out.splitlines() if line.strip().startswith("sk-gw-"))
    assert f'- "{key_digest(key)}"' in out


def test_an_operator_token_matches_only_as_its_exact_bearer() -> None:
    assert bearer_matches("Bearer metrics-key-1", "metrics-key-1")
    assert bearer_matches("bearer  metrics-key-1 ", "metrics-key-1")
    for wrong in ("", "metrics-key-1", "Basic metrics-key-1", "Bearer metrics-key-", "Bearer metrics-key-12", "Bearer "):
        assert not bearer_matches(wrong, "metrics-key-1"), wrong
