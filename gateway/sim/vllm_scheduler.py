"""Admission for the vLLM simulator: at most `max_num_seqs` running, FIFO waiting.

A request runs only when a slot is free and its KV blocks fit; otherwise it waits in
arrival order, as vLLM's scheduler keeps it in the waiting queue.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

Allocate = Callable[[], "int | None"]  # cached tokens when the blocks fit, else None


@dataclass
class _Waiter:
    allocate: Allocate
    admitted: asyncio.Future[int]


@dataclass
class Scheduler:
    max_running: int
    running: int = 0
    _waiting: deque[_Waiter] = field(default_factory=deque)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def try_admit(self, allocate: Allocate) -> int | None:
        """Admit now if nobody is queued ahead and it fits; returns cached tokens."""
        if self._waiting or self.running >= self.max_running:
            return None
        cached = allocate()
        if cached is not None:
            self.running += 1
        return cached

    def enqueue(self, allocate: Allocate) -> asyncio.Future[int]:
        waiter = _Waiter(allocate, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        return waiter.admitted

    def abandon(self, admitted: asyncio.Future[int]) -> bool:
        """A waiting client went away; True if it had already been admitted (caller must finish it)."""
        if admitted.done():
            return True
        self._waiting = deque(w for w in self._waiting if w.admitted is not admitted)
        admitted.cancel()
        return False

    def finish(self) -> None:
        self.running -= 1
        self.admit_waiting()

    def admit_waiting(self) -> None:
        while self._waiting and self.running < self.max_running:
            cached = self._waiting[0].allocate()
            if cached is None:
                return  # head-of-line waits for blocks, like vLLM's FCFS policy
            waiter = self._waiting.popleft()
            self.running += 1
            waiter.admitted.set_result(cached)
