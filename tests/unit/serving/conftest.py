from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

Run = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Each test on both event loops the gateway may run on."""
    return uvloop.run if request.param == "uvloop" else asyncio.run  # type: ignore[return-value]
