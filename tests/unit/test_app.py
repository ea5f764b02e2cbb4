"""Start-up cost: the app loads what serving needs, not what a rare path needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Each costs start-up time on every `gateway serve`, yet only one path uses it:
# reconciliation (admin API, CLI), JSON Schema checks, and tool calls.
LOADED_ON_FIRST_USE = (
    "gateway.accounting.importers",
    "gateway.accounting.reconcile",
    "jsonschema",
    "httpx",
)


def test_importing_the_app_leaves_rarely_used_modules_unloaded() -> None:
    code = f"import sys, gateway.app; print(*[m for m in {LOADED_ON_FIRST_USE!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == []


def test_the_framework_is_built_after_start_up() -> None:
    # Model calls and liveness are answered without it; it is a third of start-up's CPU.
    code = "import sys, gateway.cli, gateway.app; gateway.app.create_app(); print('fastapi' in sys.modules, 'starlette' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["False", "False"]
