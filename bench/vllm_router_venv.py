"""A separate venv with vllm-router (Rust, from PyPI) pinned by hash, for bench/compare.py.

    python bench/vllm_router_venv.py      # create or reuse bench/out/vllm-router-venv, print its vllm-router path

`bench/vllm_router.lock` lists vllm-router VLLM_ROUTER_VERSION and every dependency of it
at an exact version with the sha256 of its wheel (resolved with `pip download
--only-binary=:all:` for CPython 3.11 on Linux x86_64). `ensure()` installs it with
`pip install --require-hashes --no-deps --only-binary=:all: -r bench/vllm_router.lock`:
nothing unlisted, nothing unhashed, no source builds. Reused while the venv reports the
pinned version and was installed from the current lock file (its sha256 is stamped in
the venv), so only the first call installs.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procs
from bench.report import OUT_DIR

VLLM_ROUTER_VERSION = "0.1.17"
LOCK_FILE = Path(__file__).resolve().parent / "vllm_router.lock"
VENV_DIR = OUT_DIR / "vllm-router-venv"
STAMP = ".bench-lock-sha256"
INSTALL_TIMEOUT_S = 900


def runtime_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """No proxy for its worker connections (reqwest honours HTTP(S)_PROXY), no inherited venv."""
    env = dict(os.environ if base is None else base)
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "VIRTUAL_ENV"):
        env.pop(key, None)
    env |= {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"}
    return env


def installed_version(venv_dir: Path = VENV_DIR) -> str | None:
    return procs.venv_package_version(venv_dir, "vllm-router")


def _lock_digest() -> str:
    return hashlib.sha256(LOCK_FILE.read_bytes()).hexdigest()


def _check_lock(version: str) -> None:
    text = LOCK_FILE.read_text()
    if f"vllm-router=={version} " not in text and f"vllm-router=={version}\n" not in text:
        raise RuntimeError(f"{LOCK_FILE} does not pin vllm-router=={version}")
    if sys.version_info[:2] != (3, 11) or platform.machine() != "x86_64" or sys.platform != "linux":
        raise RuntimeError(
            f"{LOCK_FILE.name} holds CPython 3.11 Linux x86_64 wheels; this is {platform.python_version()}"
            f" on {sys.platform} {platform.machine()}"
        )


def ensure(version: str = VLLM_ROUTER_VERSION, venv_dir: Path = VENV_DIR) -> Path:
    """Return the venv's `vllm-router` executable, installing the locked wheels first if needed."""
    _check_lock(version)
    router_bin = venv_dir / "bin" / "vllm-router"
    stamp = venv_dir / STAMP
    digest = _lock_digest()
    if router_bin.exists() and stamp.exists() and stamp.read_text().strip() == digest and installed_version(venv_dir) == version:
        return router_bin
    print(f"installing vllm-router=={version} into {venv_dir} from {LOCK_FILE.name} ...", file=sys.stderr, flush=True)
    procs.pip_install(venv_dir, ["--require-hashes", "--no-deps", "--only-binary=:all:", "-r", str(LOCK_FILE)], INSTALL_TIMEOUT_S)
    got = installed_version(venv_dir)
    if got != version or not router_bin.exists():
        raise RuntimeError(f"expected vllm-router {version} in {venv_dir}, pip reports {got}")
    stamp.write_text(digest + "\n")
    return router_bin


if __name__ == "__main__":
    print(ensure())
