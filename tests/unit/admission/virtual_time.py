"""An asyncio loop on virtual time: whenever every task is asleep, time jumps to the
next timer instead of waiting for it. Queue tests then assert exact admission times
without real sleeps, and the code under test keeps using plain asyncio timeouts."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

START = 1000.0


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.now = START

    def select(self, timeout: float | None = None) -> list[Any]:
        # Poll without blocking; if nothing is ready, the loop was about to sleep until
        # its next timer, so jump there. None means nothing is scheduled: block for real
        # (a test deadlock then surfaces as pytest-timeout, not as a silent pass).
        ready: list[Any] = super().select(None if timeout is None else 0)
        if not ready and timeout is not None and timeout > 0:
            self.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._jumping.now


def loop_clock() -> float:
    """The running loop's (virtual) time: the clock the queue and buckets share in tests."""
    return asyncio.get_running_loop().time()


def run_virtual(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main())
