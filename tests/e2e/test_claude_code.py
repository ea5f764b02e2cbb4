"""Claude Code pointed at the gateway (`ANTHROPIC_BASE_URL`, a gateway key as
`ANTHROPIC_API_KEY`), in front of the Anthropic simulator: a print-mode session that
streams, calls a tool, gets its result and answers; every call reaches the provider
with the provider's key, reads the prompt cache Claude Code marks, and is booked at the
formula to the last digit.

The binary: `CLAUDE_CODE_BIN`, else `claude` on PATH (`npm install -g
@anthropic-ai/claude-code`). Outside CI a missing one skips this test with the reason
printed; in CI it is a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.support.claude import UPSTREAM_KEY, ClaudeStack, formula, running_claude_stack

# Claude Code's first request (system prompt and tool schemas) is well over the test
# policy's 64 KiB body bound; the gateway's default is 8 MiB.
BIG_BODIES = 8 * 1024 * 1024


@pytest.fixture(scope="module")
def claude_code() -> str:
    found = os.environ.get("CLAUDE_CODE_BIN") or shutil.which("claude")
    if not found:
        reason = "Claude Code is not installed (npm install -g @anthropic-ai/claude-code, or set CLAUDE_CODE_BIN)"
        if IN_CI:
            pytest.fail(f"{reason}; CI must run this test")
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module")
def claude(claude_code: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClaudeStack]:
    with running_claude_stack(tmp_path_factory.mktemp("claude-code"), max_body_bytes=BIG_BODIES) as running:
        yield running




def test_a_claude_code_session_with_a_tool_streams_through_the_gateway(claude_code: str, claude: ClaudeStack,
                                                                     tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "notes.txt").write_text("Invoice 42 is 1,250.00 EUR.\n")
    task_id = claude.open_task("5.00")
    billed = len(claude.sim.state.usage.records)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "ANTHROPIC_BASE_URL": claude.stack.root,
           "ANTHROPIC_API_KEY": claude.stack.key, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "ANTHROPIC_MODEL": "claude-small", "ANTHROPIC_SMALL_FAST_MODEL": "claude-small",
           "ANTHROPIC_DEFAULT_HAIKU_MODEL": "claude-small", "DISABLE_AUTOUPDATER": "1",
           "ANTHROPIC_CUSTOM_HEADERS": f"x-task-id: {task_id}"}
    # Only Read: the simulator calls the first tool with made-up input, which must do no harm.
    done = subprocess.run([claude_code, "-p", "What does notes.txt say about invoice 42?", "--output-format", "stream-json",
                           "--verbose", "--max-turns", "4", "--tools", "Read"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=180)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    [result] = [e for e in events if e.get("type") == "result"]
    assert done.returncode == 0 and not result["is_error"], done.stdout[-2000:] + done.stderr[-2000:]
    assert result["num_turns"] >= 2  # a tool call, its result, the answer
    tool_uses = [b for e in events if e.get("type") == "assistant" for b in e["message"]["content"] if b["type"] == "tool_use"]
    assert tool_uses and tool_uses[0]["name"] == "Read"
    assert claude.sim.stats.last_authorization == UPSTREAM_KEY and claude.stack.key not in str(claude.sim.stats.last_headers)
    assert claude.sim.stats.last_body is not None and claude.sim.stats.last_body["stream"] is True
    records = claude.sim.state.usage.records[billed:]
    assert len(records) >= 2 and records[-1].cache_read > 0  # Claude Code's own breakpoints, read on the next turn
    booked = claude.task_events(task_id)
    assert [b["status"] for b in booked] == ["ok"] * len(records)
    assert sorted(Decimal(b["cost_usd"]) for b in booked) == sorted(formula(r) for r in records)
