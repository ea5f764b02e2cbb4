"""The CLI commands an operator runs, as they run them."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai
import pytest

from gateway.cli import STARTUP_FAILURE
from gateway.cli import main as cli_main
from tests.e2e.test_openai_sdk import wait_until
from tests.support.processes import free_port
from tests.support.stack import running_stack

MINIMAL_POLICY = Path(__file__).resolve().parents[2] / "policies" / "minimal.yaml"


def booked_events(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM usage_events").fetchone()[0])


def test_reconcile_command_reports_against_the_provider(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running_stack(tmp_path) as stack:
        client = openai.OpenAI(base_url=stack.gateway, api_key=stack.key, max_retries=0)
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "bill me"}])
        # The settlement commits just after the answer; the CLI reads the file itself.
        wait_until(lambda: booked_events(stack.var_dir / "ledger.db") == 1)
        code = cli_main(["reconcile", "--provider", "hosted", "--since", datetime.now(UTC).date().isoformat(), "--quiet",
                         "--policy", str(stack.policy_path), "--database-url", f"sqlite:///{stack.var_dir / 'ledger.db'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "gpt-4o-mini" in out and "matched" in out


def test_pricing_show_names_the_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["pricing", "show", "gpt-4o-mini"]) == 0
    assert "pricing/overrides.yaml" in capsys.readouterr().out
    assert cli_main(["pricing", "show", "no-such-model-anywhere"]) == 1


@pytest.mark.parametrize("kind,probe", [("hosted", "/v1/models"), ("vllm", "/health")])
def test_sim_command_serves(kind: str, probe: str) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "sim", kind, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}{probe}", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the simulator did not start"
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_refuses_several_workers_without_shared_limits(tmp_path: Path) -> None:
    # In-process buckets per worker would let each worker admit a tenant's whole limit.
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | {"GATEWAY_VAR_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--policy", str(MINIMAL_POLICY), "--workers", "2",
                           "--port", str(free_port())], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--workers 2 needs REDIS_URL" in done.stderr


def test_serve_whose_ledger_cannot_open_says_why_and_exits(tmp_path: Path) -> None:
    nothing_listens = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    env = os.environ | {"GATEWAY_VAR_DIR": str(tmp_path), "DATABASE_URL": nothing_listens}
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--policy", str(MINIMAL_POLICY), "--port", str(free_port())],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == STARTUP_FAILURE
    assert "Connection refused" in done.stderr and "Application startup failed" in done.stderr
