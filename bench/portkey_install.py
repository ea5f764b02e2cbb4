"""The Portkey AI gateway (Node.js) pinned by hash, for bench/compare.py.

    python bench/portkey_install.py       # install or reuse bench/out/portkey, print the server's entry point

`bench/portkey/package.json` pins `@portkey-ai/gateway` to PORTKEY_VERSION exactly and
`bench/portkey/package-lock.json` records the sha512 `integrity` of every package in the
tree; `npm ci` refuses anything that does not match. Both are copied to bench/out/portkey
(git-ignored) and installed there with `npm ci --ignore-scripts --no-audit --no-fund`: the
package ships its server prebuilt (`build/start-server.js`), so no install script is needed
(its only one, `postinstall: patch-package`, has no patches to apply in the published
package). Reused while the copied files match the pinned ones and the package reports
PORTKEY_VERSION, so only the first call installs.

package.json also overrides two transitive versions: `@hono/node-server` 1.14.1 and
`@hono/node-ws` 1.2.0 (which accepts it). From 1.14.2 on, @hono/node-server's Response
keeps a fetch response's immutable Headers, and Portkey 1.15.2 then answers every
streamed chat completion with 500 (`TypeError: immutable` in updateHeaders; upstream
issues Portkey-AI/gateway#1389 and #1550).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import OUT_DIR

PORTKEY_PACKAGE = "@portkey-ai/gateway"
PORTKEY_VERSION = "1.15.2"
PIN_DIR = Path(__file__).resolve().parent / "portkey"
PIN_FILES = ("package.json", "package-lock.json")
INSTALL_DIR = OUT_DIR / "portkey"
ENTRY = Path("node_modules") / PORTKEY_PACKAGE / "build" / "start-server.js"
INSTALL_TIMEOUT_S = 600


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` not found on PATH; the Portkey gateway needs Node.js (>= 18) and npm")
    return path


def runtime_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """No proxy for its upstream fetches (it reads HTTP(S)_PROXY), no Redis cache, no UI."""
    env = dict(os.environ if base is None else base)
    for key in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "REDIS_CONNECTION_STRING",
        "TRUSTED_CUSTOM_HOSTS",
        "PORT",
    ):
        env.pop(key, None)
    env |= {"NODE_ENV": "production", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    return env


def node_version() -> str:
    return subprocess.run([tool("node"), "--version"], capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def installed_version(install_dir: Path = INSTALL_DIR) -> str | None:
    manifest = install_dir / "node_modules" / PORTKEY_PACKAGE / "package.json"
    try:
        version = json.loads(manifest.read_text()).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None


def check_pins(version: str = PORTKEY_VERSION) -> None:
    """The committed lock must pin exactly `version`, with an integrity hash for every package."""
    lock = json.loads((PIN_DIR / "package-lock.json").read_text())
    packages: dict[str, dict[str, object]] = lock.get("packages", {})
    pinned = packages.get(f"node_modules/{PORTKEY_PACKAGE}", {}).get("version")
    if pinned != version:
        raise RuntimeError(f"{PIN_DIR / 'package-lock.json'} pins {PORTKEY_PACKAGE} {pinned}, expected {version}")
    unhashed = [name for name, meta in packages.items() if name and not str(meta.get("integrity", "")).startswith("sha512-")]
    if unhashed:
        raise RuntimeError(f"package-lock.json has no sha512 integrity for: {', '.join(unhashed)}")


def _up_to_date(install_dir: Path, version: str) -> bool:
    if installed_version(install_dir) != version or not (install_dir / ENTRY).exists():
        return False
    try:
        return all((install_dir / name).read_bytes() == (PIN_DIR / name).read_bytes() for name in PIN_FILES)
    except OSError:
        return False


def ensure(version: str = PORTKEY_VERSION, install_dir: Path = INSTALL_DIR) -> Path:
    """Return the server's entry point (run it with `node`), installing the pinned tree first if needed."""
    check_pins(version)
    if _up_to_date(install_dir, version):
        return install_dir / ENTRY
    install_dir.mkdir(parents=True, exist_ok=True)
    for name in PIN_FILES:
        shutil.copyfile(PIN_DIR / name, install_dir / name)
    print(f"installing {PORTKEY_PACKAGE}@{version} into {install_dir} (npm ci) ...", file=sys.stderr, flush=True)
    subprocess.run(
        [tool("npm"), "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
        cwd=install_dir,
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    got = installed_version(install_dir)
    if got != version or not (install_dir / ENTRY).exists():
        raise RuntimeError(f"expected {PORTKEY_PACKAGE} {version} with {ENTRY} in {install_dir}, found {got}")
    return install_dir / ENTRY


if __name__ == "__main__":
    print(ensure())
