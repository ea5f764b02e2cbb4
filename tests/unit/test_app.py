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


def test_the_framework_is_built_at_start_up_not_at_import() -> None:
    # Commands that import the app without serving it do not pay for the framework.
    code = "import sys, gateway.cli, gateway.app; gateway.app.create_app(); print('fastapi' in sys.modules, 'starlette' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["False", "False"]


LIFESPAN = """
import asyncio, gc
from gateway.app import create_app

async def main():
    app = create_app()
    inbox, sent, started = asyncio.Queue(), [], asyncio.Event()
    async def send(message):
        sent.append(message["type"])
        started.set()
    await inbox.put({"type": "lifespan.startup"})
    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, send))
    await started.wait()
    assert sent == ["lifespan.startup.complete"], sent
    print(gc.get_freeze_count(), len(gc.get_objects()))
    await inbox.put({"type": "lifespan.shutdown"})
    await lifespan
    print(gc.get_freeze_count())

asyncio.run(main())
"""


def test_what_start_up_built_is_kept_out_of_full_collections(tmp_path: Path) -> None:
    # A full collection walks every tracked object and stalls every request meanwhile:
    # 60-70 ms over what start-up built, every 10-20 s under load (bench/gc_pauses.py).
    env = {"PATH": "/usr/bin:/bin", "GATEWAY_POLICY": str(ROOT / "policies" / "minimal.yaml"),
           "GATEWAY_VAR_DIR": str(tmp_path / "var")}
    result = subprocess.run([sys.executable, "-c", LIFESPAN], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120, check=True)
    frozen, walked, after_shutdown = map(int, result.stdout.split())
    assert frozen > 20 * walked, f"{walked} objects left for full collections to walk, {frozen} frozen"
    assert after_shutdown == 0, "an app stopped in a process that goes on leaves nothing frozen"
