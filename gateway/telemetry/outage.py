"""Quiet, honest logs for a dependency that is down (the ledger database): one line
when it goes down (with the first error's traceback), a summary at most every
`summary_every_s` while it stays down (what failed and what was kept for later), and
one line when it is back. An outage of minutes then costs a handful of lines, not one
traceback per request."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable


class OutageLog:
    """Safe to call from any thread (the ledger writer's and the event loop's)."""

    def __init__(self, log: logging.Logger, what: str, summary_every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log, self._what, self._every, self._clock = log, what, summary_every_s, clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._last_summary = 0.0
        self._counts: Counter[str] = Counter()

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, error: BaseException, what_failed: str) -> None:
        """`what_failed` ("commits", "settlements spooled", ...) happened because it is down."""
        now = self._clock()
        with self._lock:
            self._counts[what_failed] += 1
            if self._down_since is None:
                self._down_since = self._last_summary = now
                self._log.error("the %s is unavailable (%s: %s); logging a summary every %.0fs until it is back",
                                self._what, type(error).__name__, error, self._every, exc_info=error)
                return
            if now - self._last_summary < self._every:
                return
            self._last_summary = now
            summary = self._summary()
            seconds = now - self._down_since
        self._log.warning("the %s is still unavailable after %.0fs: %s", self._what, seconds, summary)

    def recovered(self) -> None:
        if self._down_since is None:  # the common case: no lock taken
            return
        with self._lock:
            if self._down_since is None:
                return
            seconds = self._clock() - self._down_since
            summary = self._summary()
            self._down_since = None
            self._counts.clear()
        self._log.warning("the %s is available again after %.0fs (while it was down: %s)", self._what, seconds, summary)

    def _summary(self) -> str:
        return ", ".join(f"{count} {name}" for name, count in sorted(self._counts.items()))
