"""Shared fixtures: real Redis and PostgreSQL, each test with its own key prefix /
database, cleaned up afterwards.

Outside CI a missing service skips its tests with the reason printed; in CI (CI=true)
a missing service is a failure, never a silent skip.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379")
POSTGRES_DSN = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432")
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _service_missing(what: str, error: Exception) -> None:
    reason = f"{what} is not reachable ({type(error).__name__}: {error})"
    if IN_CI:
        pytest.fail(f"{reason}; CI must run against real services")
    pytest.skip(reason)


@pytest.fixture
def redis_prefix() -> Iterator[tuple[str, str]]:
    """(redis URL, a key prefix unique to this test); keys under it are deleted after."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        _service_missing(f"Redis at {REDIS_URL}", exc)
    prefix = f"gwtest-{secrets.token_hex(6)}"
    try:
        yield REDIS_URL, prefix
    finally:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        client.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test, dropped afterwards."""
    import psycopg

    name = f"gwtest_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(f"{POSTGRES_DSN}/test", autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        _service_missing(f"PostgreSQL at {POSTGRES_DSN}", exc)
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{POSTGRES_DSN}/{name}"
    finally:
        with psycopg.connect(f"{POSTGRES_DSN}/test", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
