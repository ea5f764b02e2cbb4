"""Busy-polling for a short while after each step of a lone call, instead of sleeping.

On a virtual machine a core that goes idle halts, and waking it for the next packet
(the upstream's answer, the client's next request) costs a round trip through the
hypervisor and a cold cache: polling took 0.03-0.15 ms off the time the gateway adds to
a first token at one call at a time on this project's machines (bench/RESULTS.md),
where the guest's own halt-polling is off. So while one call alone is in
flight, and for `window_s` after its last step, the event loop keeps its core: it turns
through its events without blocking, yielding the core to any other thread that wants
it (the ledger writer) on each turn.

It stops polling when the window passes with nothing happening (an upstream that thinks
for longer, an idle gateway: the loop sleeps as it always did), and does not poll with
two or more calls in flight, where the loop has work to turn to and polling would only
take time from it. The cost is the core's idle time within the window: at one call at a
time against a fast upstream, the whole core; against a model streaming a token every
30 ms, about `window_s` per token. `GATEWAY_BUSY_POLL_US=0` turns it off."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable


class BusyPoll:
    def __init__(self, window_s: float, in_flight: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._in_flight = in_flight
        self._clock = clock
        self._last = 0.0
        self._polling = False

    def touch(self) -> None:
        """A step of a call happened now: poll for the window, if the call is alone."""
        if self.window_s <= 0:
            return
        self._last = self._clock()
        if not self._polling and self._in_flight() <= 1:
            self._polling = True
            asyncio.get_running_loop().call_soon(self._poll)

    def _poll(self) -> None:
        if self._in_flight() <= 1 and self._clock() - self._last < self.window_s:
            # Releases the GIL and the core: the ledger writer, if it is waiting, runs now
            # rather than whenever the loop would next block.
            os.sched_yield()
            asyncio.get_running_loop().call_soon(self._poll)
        else:
            self._polling = False

    @property
    def polling(self) -> bool:
        return self._polling
