"""Hot reload reads and parses the changed file in a worker thread: however long that
takes, the event loop goes on serving; a file refused keeps the last good policy live."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.routing import reload
from gateway.routing.reload import PolicyHolder
from tests.support.policies import alias_bomb
from tests.unit.routing.test_loader import MINIMAL

GUARD_S = 10  # bounds a wait so that a bug fails the test instead of hanging it


def holder(tmp_path: Path) -> tuple[PolicyHolder, Path, list[str]]:
    path = tmp_path / "policy.yaml"
    path.write_text(MINIMAL)
    results: list[str] = []
    return PolicyHolder(path, on_result=results.append), path, results


def test_a_slow_parse_runs_while_the_loop_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policies, path, results = holder(tmp_path)
    path.write_text(MINIMAL.replace("bench-model", "new-model"))
    parsing, finish = threading.Event(), threading.Event()
    real_load = reload.load_policy_file

    def slow_load(*args: Any) -> Any:
        parsing.set()
        finish.wait(GUARD_S)  # a parse that takes as long as the test likes
        return real_load(*args)

    monkeypatch.setattr(reload, "load_policy_file", slow_load)

    async def scenario() -> tuple[bool, bool]:
        reloading = asyncio.create_task(policies.reload_off_loop())
        await asyncio.to_thread(parsing.wait, GUARD_S)
        # Back on the loop while the parse is still under way: the loop was not blocked.
        served_meanwhile = not reloading.done() and "bench-model" in policies.current.policy.models
        finish.set()
        return served_meanwhile, await reloading

    served_meanwhile, went_live = asyncio.run(scenario())
    assert served_meanwhile, "the loop waited for the parse"
    assert went_live and list(policies.current.policy.models) == ["new-model"]
    assert results == ["ok"]


def test_an_alias_bomb_on_reload_keeps_the_last_good_policy(tmp_path: Path) -> None:
    policies, path, results = holder(tmp_path)
    path.write_text(MINIMAL + "routes:\n" + "".join(f"  {line}\n" for line in alias_bomb(9).splitlines()))
    assert asyncio.run(policies.reload_off_loop()) is False
    assert "bench-model" in policies.current.policy.models
    assert results == ["rejected"]
    assert policies.last_error is not None and "the aliases here make" in policies.last_error
    path.write_text(MINIMAL.replace("bench-model", "fixed-model"))
    assert asyncio.run(policies.reload_off_loop()) is True
    assert list(policies.current.policy.models) == ["fixed-model"]
