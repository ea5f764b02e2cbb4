from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.stack import Stack, running_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("stack")) as running:
        yield running


@pytest.fixture
def fresh_stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path) as running:
        yield running


def sim_config(sim_root: str, **patch: object) -> None:
    httpx.post(f"{sim_root}/sim/config", json=patch, timeout=5).raise_for_status()


def sim_stats(sim_root: str) -> dict[str, object]:
    stats: dict[str, object] = httpx.get(f"{sim_root}/sim/stats", timeout=5).json()
    return stats
