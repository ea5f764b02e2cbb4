"""`gateway demo` as a new user runs it: the printed key and snippets work as printed
(the openai SDK's and the anthropic SDK's),
the printed admin key opens the printed finance dashboard, and after a restart the
user's policy edits are still there and `gateway reconcile` (no flags) still matches,
for both simulated providers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai

from tests.support.processes import free_port

HELLO: Any = [{"role": "user", "content": "Hello"}]
EDIT = "\n  edited-route:                 # added by the user\n    chain: [sim-small]\n"


@contextmanager
def demo(var_dir: Path) -> Iterator[dict[str, str]]:
    """A demo on fresh ports; yields what its banner printed."""
    ports = [free_port() for _ in range(4)]
    env = {k: v for k, v in os.environ.items() if k not in ("GATEWAY_POLICY", "GATEWAY_ADMIN_KEY", "DATABASE_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", str(ports[0]), "--hosted-port", str(ports[1]), "--vllm-port", str(ports[2]),
         "--anthropic-port", str(ports[3])],
        env={**env, "GATEWAY_VAR_DIR": str(var_dir)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        banner = ""
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while "Press Ctrl-C" not in banner:
            assert time.monotonic() < deadline and proc.poll() is None, banner
            banner += proc.stdout.readline()
        found = {name: re.search(pattern, banner).group(1)  # type: ignore[union-attr]
                 for name, pattern in (("base_url", r"base URL : (\S+)"), ("key", r"API key  : (\S+)"),
                                       ("ui", r"address  : (\S+)"), ("admin_key", r"admin key: (\S+)"))}
        yield {**found, "banner": banner}
    finally:
        proc.terminate()
        proc.wait(15)


def reports(var_dir: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """A report command run next to the demo, as the banner says: no flags, no policy, no keys."""
    env = {k: v for k, v in os.environ.items() if k not in ("GATEWAY_POLICY", "DATABASE_URL") and not k.startswith("DEMO_")}
    return subprocess.run([sys.executable, "-m", "gateway", *command], env={**env, "GATEWAY_VAR_DIR": str(var_dir)},
                          capture_output=True, text=True, timeout=120)


def test_demo_prints_a_working_key_and_base_url(tmp_path: Path) -> None:
    with demo(tmp_path / "var") as printed:
        assert f'OpenAI(base_url="{printed["base_url"]}", api_key="{printed["key"]}")' in printed["banner"]
        client = openai.OpenAI(base_url=printed["base_url"], api_key=printed["key"], max_retries=5)
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
        assert reply.choices[0].message.content
        pooled = client.chat.completions.create(model="pool-model", messages=HELLO)
        assert pooled.choices[0].message.content


def test_the_printed_anthropic_snippet_and_claude_code_line_work(tmp_path: Path) -> None:
    """The README's Anthropic example, against the demo: Claude's simulator is one of its
    upstreams, and the call is booked at the demo policy's Claude price."""
    with demo(tmp_path / "var") as printed:
        root = printed["base_url"].removesuffix("/v1")
        assert f'Anthropic(base_url="{root}", api_key="{printed["key"]}")' in printed["banner"]
        assert f"ANTHROPIC_BASE_URL={root} ANTHROPIC_API_KEY={printed['key']}" in printed["banner"]
        claude = anthropic.Anthropic(base_url=root, api_key=printed["key"], max_retries=5)
        raw = claude.messages.with_raw_response.create(model="claude-small", max_tokens=256, messages=HELLO)
        reply = raw.parse()
        assert reply.content[0].type == "text" and reply.content[0].text
        per_million = {"input": Decimal("1.00"), "output": Decimal("5.00")}  # policies/demo.yaml's claude-small
        expected = (reply.usage.input_tokens * per_million["input"] + reply.usage.output_tokens * per_million["output"]) / 1_000_000
        assert Decimal(raw.headers["x-gateway-cost-usd"]) == expected
        with claude.messages.stream(model="claude-small", max_tokens=64, messages=HELLO) as stream:
            assert stream.get_final_message().usage.output_tokens > 0


def test_a_kept_policy_without_claude_gets_a_note_instead_of_a_snippet_that_would_fail(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    policy = var_dir / "demo" / "policy.yaml"
    with demo(var_dir) as first:
        assert "claude.messages.create" in first["banner"]
    text = policy.read_text()
    start = text.index("  claude-small:")
    end = text.index("\n\n", start)  # the model's block ends the models section
    policy.write_text(text[:start] + text[end + 1:])  # as a policy kept from an older demo
    with demo(var_dir) as second:
        assert "claude.messages.create" not in second["banner"] and "ANTHROPIC_BASE_URL" not in second["banner"]
        assert "your policy has no `claude-small`: delete it" in second["banner"]


def test_the_printed_admin_key_opens_the_printed_dashboard(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    with demo(var_dir) as printed:
        ui, admin_key = printed["ui"], printed["admin_key"]
        assert ui == printed["base_url"].removesuffix("/v1") + "/ui/"
        assert (var_dir / "demo" / "admin-key").read_text().strip() == admin_key
        assert (var_dir / "demo" / "admin-key").stat().st_mode & 0o077 == 0, "a key file only its owner reads"
        with httpx.Client(timeout=30) as browser:
            assert 'type="password"' in browser.get(ui).text
            signed = browser.post(ui + "sign-in", data={"admin_key": admin_key})
            assert signed.status_code == 303 and "gateway_ui_session" in browser.cookies
            assert 'id="tenants"' in browser.get(ui).text
        costs = httpx.get(ui.removesuffix("/ui/") + "/admin/costs", headers={"authorization": f"Bearer {admin_key}"})
        assert costs.status_code == 200


def test_a_restart_keeps_policy_edits_and_reconciliation_still_matches(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    policy = var_dir / "demo" / "policy.yaml"
    with demo(var_dir) as first:
        client = openai.OpenAI(base_url=first["base_url"], api_key=first["key"], max_retries=5)
        for _ in range(2):
            client.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
        claude = anthropic.Anthropic(base_url=first["base_url"].removesuffix("/v1"), api_key=first["key"], max_retries=5)
        claude.messages.create(model="claude-small", max_tokens=64, messages=HELLO)
        policy.write_text(policy.read_text() + EDIT)
    with demo(var_dir) as second:
        assert (second["key"], second["admin_key"]) == (first["key"], first["admin_key"])
        assert second["base_url"] != first["base_url"], "a new port: the simulators' ports in the policy follow"
        assert "kept your" in second["banner"] and EDIT in policy.read_text()
        client = openai.OpenAI(base_url=second["base_url"], api_key=second["key"], max_retries=5)
        assert "edited-route" in {m.id for m in client.models.list()}
        client.chat.completions.create(model="edited-route", messages=HELLO)
        # Read through the admin API: the settlement of the last call is committed first.
        rows = httpx.get(second["base_url"].removesuffix("/v1") + "/admin/costs", params={"group_by": "tenant"},
                         headers={"authorization": f"Bearer {second['admin_key']}"}).json()["rows"]
        assert rows[0]["requests"] == 4

        reconciled = reports(var_dir, "reconcile", "--quiet")
        assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
        # Both simulators' reports outlive a restart: the Claude call of the first run is still there.
        claude_part, hosted_part = reconciled.stdout.split("Reconciliation of upstream `hosted`")
        assert "upstream `claude`" in claude_part and "Total: 1/1 requests" in claude_part
        assert "All groups matched." in claude_part
        assert "All groups matched." in hosted_part and "Total: 3/3 requests" in hosted_part
        routes = reports(var_dir, "routes", "report")
        assert routes.returncode == 0, routes.stdout + routes.stderr
        assert "edited-route | 1 | 1 |" in routes.stdout
