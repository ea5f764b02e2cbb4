"""Start simulators on real loopback ports, one fresh server per test."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.sim.hosted import HostedSimConfig, HostedSimulator, create_hosted_app
from gateway.sim.vllm import VllmSimConfig, VllmSimulator, create_vllm_app
from tests.support.servers import run_asgi_in_thread


@dataclass
class RunningHosted:
    url: str  # root, without /v1
    app: HostedSimulator


@dataclass
class RunningVllm:
    url: str
    app: VllmSimulator


@pytest.fixture
def start_hosted() -> Iterator[Callable[..., RunningHosted]]:
    with contextlib.ExitStack() as stack:
        def start(**fields: Any) -> RunningHosted:
            app = create_hosted_app(HostedSimConfig(**fields))
            return RunningHosted(stack.enter_context(run_asgi_in_thread(app)), app)

        yield start


@pytest.fixture
def start_vllm() -> Iterator[Callable[..., RunningVllm]]:
    with contextlib.ExitStack() as stack:
        def start(**fields: Any) -> RunningVllm:
            app = create_vllm_app(VllmSimConfig(**fields))
            return RunningVllm(stack.enter_context(run_asgi_in_thread(app)), app)

        yield start


def wait_until(check: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll `check` until true, failing after a bounded deadline."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        time.sleep(0.01)
