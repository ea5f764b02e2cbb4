"""Work an answer need not wait for, run while the gateway waits anyway.

Booking a call (its usage events, the end of its hold) and recording its metrics take
tens of microseconds, and the answer does not depend on them: it already carries its
cost. Done before the answer is sent, they add to every call's latency; done right
after it, they delay the next request that arrives. So they wait here until the event
loop next waits on an upstream - another call's request is on the wire, and the
process would otherwise sit idle - or `max_delay_s` at the latest.

Readers that must see every answered call (the admin API through
`Accounting.flush`, `/metrics`) run the deferred work first. Nothing here is durable: the
hold made before the call is, and a crash before the booking commits leaves that hold
for the sweeper, as a crash between an answer and its commit always has.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("gateway")
MAX_DELAY_S = 0.002


class DeferredWork:
    def __init__(self, max_delay_s: float = MAX_DELAY_S) -> None:
        self.max_delay_s = max_delay_s
        self._items: list[Callable[[], object]] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, item: Callable[[], object]) -> None:
        """Run `item` at the next upstream wait, or within `max_delay_s`."""
        self._items.append(item)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.max_delay_s, self._due)

    def _due(self) -> None:
        """The delay is over: run behind what is already waiting to run. uvloop runs due
        timers before the callbacks queued in the last turn - among them the first step
        of a request that has just arrived, which would otherwise wait for these books
        (0.2-0.3 ms at one call at a time, measured when the timer fell due as a request
        came in)."""
        self._timer = None
        asyncio.get_running_loop().call_soon(self.run)

    def soon(self) -> None:
        """About to wait on an upstream: run what is waiting once the request is sent."""
        if self._items:
            asyncio.get_running_loop().call_soon(self.run)

    def run(self) -> None:
        """Run everything waiting, now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, self._items = self._items, []
        for item in items:
            try:
                item()
            except Exception:  # one item's bug must not cost the others their books
                log.exception("deferred work failed")

    def __len__(self) -> int:
        return len(self._items)
