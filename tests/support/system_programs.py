"""Programs from Debian packages that some tests drive (Prometheus, Chromium). Outside
CI a missing one skips its tests with the reason printed; in CI it is a failure, as
for the services in tests/conftest.py (`.ci/run` installs them)."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import IN_CI


def debian_program(name: str, package: str) -> str:
    """The path of `name`, from the Debian package `package`."""
    found = shutil.which(name)
    if found is None:
        reason = f"`{name}` is not installed (apt-get install {package})"
        if IN_CI:
            pytest.fail(f"{reason}; CI must run these tests (.ci/run installs it)")
        pytest.skip(reason)
    return found


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def playwright_available() -> None:
    """playwright (from the lock) drives Debian's Chromium; it never downloads a browser."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        reason = f"playwright is not installed ({exc}); `python3 run.py test` installs it from requirements.lock"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
