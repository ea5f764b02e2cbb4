#!/usr/bin/env python3
"""Set-up and entry point: `python3 run.py demo` or `python3 run.py test`.

Creates `.venv` from the hash-pinned `requirements.lock` the first time (and again
whenever the lock changes), then runs the gateway CLI or the test suite inside it.
Only the standard library is used here, so a fresh machine needs nothing but Python.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
LOCK = ROOT / "requirements.lock"
STAMP = VENV / ".lock-sha256"
BIN = VENV / "bin"


def _lock_digest() -> str:
    return hashlib.sha256(LOCK.read_bytes() + (ROOT / "pyproject.toml").read_bytes()).hexdigest()


def ensure_venv() -> None:
    if STAMP.exists() and STAMP.read_text().strip() == _lock_digest():
        return
    if sys.version_info < (3, 11):
        sys.exit("Python 3.11 or newer is needed (found %s)" % sys.version.split()[0])
    print("Setting up .venv from requirements.lock (first run only) ...", flush=True)
    if not (BIN / "python").exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [str(BIN / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--require-hashes", "--no-deps", "-r", str(LOCK)], check=True)
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", "-e", str(ROOT)], check=True)
    # Byte-compile our own modules now, as Python does on a first import - unless
    # PYTHONDONTWRITEBYTECODE is set, when every start would compile them again (~0.3 s).
    # A stale file is simply recompiled in memory, so edits are always picked up.
    subprocess.run([str(BIN / "python"), "-m", "compileall", "-q", str(ROOT / "gateway")], check=False,
                   stdout=subprocess.DEVNULL)
    STAMP.write_text(_lock_digest())


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: python3 run.py demo | test [pytest args] | <any gateway subcommand>")
        return 0
    ensure_venv()
    os.chdir(ROOT)
    if argv[0] == "test":
        cmd = [str(BIN / "python"), "-m", "pytest", *argv[1:]]
    else:
        cmd = [str(BIN / "gateway"), *argv]
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
