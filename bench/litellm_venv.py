"""A separate venv with the LiteLLM proxy pinned to one known-good release, for bench/compare.py.

    python bench/litellm_venv.py          # create or reuse bench/out/litellm-venv, print its litellm path

Pinned to LITELLM_VERSION exactly. Never 1.82.7, 1.82.8 or 1.107.0 (malicious releases):
`ensure()` refuses them even if someone edits the pin. Reused when `pip show` already
reports the pinned version, so only the first call installs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procs
from bench.report import OUT_DIR

LITELLM_VERSION = "1.108.7"
BANNED_VERSIONS = frozenset({"1.82.7", "1.82.8", "1.107.0"})
VENV_DIR = OUT_DIR / "litellm-venv"
INSTALL_TIMEOUT_S = 1200


def runtime_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for running the proxy offline: bundled cost map, no telemetry, no
    update checks, no database, no master key inherited from the caller."""
    env = dict(os.environ if base is None else base)
    for key in ("DATABASE_URL", "LITELLM_MASTER_KEY", "LITELLM_SALT_KEY", "REDIS_URL", "REDIS_HOST", "STORE_MODEL_IN_DB"):
        env.pop(key, None)
    env |= {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # use the cost map shipped in the wheel, not a GitHub download
        "LITELLM_OFFLINE_MODE": "true",  # docs: stops every catalog fetch LiteLLM makes on its own (only "true" counts)
        "LITELLM_TELEMETRY": "False",
        "LITELLM_DONT_SHOW_FEEDBACK_BOX": "true",
        "LITELLM_LOG": "ERROR",
        "DISABLE_SCHEMA_UPDATE": "True",
        "DISABLE_ADMIN_UI": "True",
        "HF_HUB_OFFLINE": "1",  # no tokenizer downloads from the hub
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "PYTHONUNBUFFERED": "1",
    }
    return env


def installed_version(venv_dir: Path = VENV_DIR) -> str | None:
    return procs.venv_package_version(venv_dir, "litellm")


def ensure(version: str = LITELLM_VERSION, venv_dir: Path = VENV_DIR) -> Path:
    """Return the venv's `litellm` executable, installing `litellm[proxy]==version` first if needed."""
    if version in BANNED_VERSIONS:
        raise ValueError(f"litellm {version} is a known-malicious release; refusing to install it")
    litellm_bin = venv_dir / "bin" / "litellm"
    if installed_version(venv_dir) == version and litellm_bin.exists():
        return litellm_bin
    print(f"installing litellm[proxy]=={version} into {venv_dir} ...", file=sys.stderr, flush=True)
    procs.pip_install(venv_dir, [f"litellm[proxy]=={version}"], INSTALL_TIMEOUT_S)
    got = installed_version(venv_dir)
    if got != version:
        raise RuntimeError(f"expected litellm {version} in {venv_dir}, pip reports {got}")
    return litellm_bin


if __name__ == "__main__":
    print(ensure())
