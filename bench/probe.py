"""`python -m bench.probe serve ...`: the gateway, with timestamps taken on a call's path.

For `bench/c1_split.py`. It wraps, before the gateway starts, the protocol callbacks of
the gateway's server connection (the client's side) and of its upstream client, and the budget hold:
- `in`: the client's request bytes reach the gateway;
- `up_out`: the upstream request is written;
- `up_in`: the upstream's first bytes are read;
- `first_out` / `out`: the client's first body write / the last one.
Meant for one call at a time (c=1): with several in flight, the segments mix calls.

On SIGUSR1 it writes what it has to the JSON file `$PROBE_OUT` and starts over: the
medians of each segment, of the budget hold (`Accounting.reserve`), how many calls
found the hold made ahead for them still being committed, and the CPU seconds of each
thread by name. Not for production: the wrappers cost a few microseconds per call.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

SEGMENTS = {"request_to_upstream_us": ("in", "up_out"), "upstream_us": ("up_out", "up_in"),
            "upstream_to_first_write_us": ("up_in", "first_out"), "upstream_to_last_write_us": ("up_in", "out")}


class Probe:
    def __init__(self, out: Path, clock: Callable[[], float] = time.perf_counter) -> None:
        self.out = out
        self.clock = clock
        self.marks: dict[str, float] = {}
        self.calls: list[dict[str, float]] = []
        self.reserve_s: list[float] = []
        self.draws = self.waits = 0
        self.cpu_at_start = thread_cpu()

    def mark(self, name: str, *, first: bool = True) -> None:
        if not first or name not in self.marks:
            self.marks[name] = self.clock()

    def request_arrived(self) -> None:
        if not self.marks or "out" in self.marks:  # a body read in several parts is one arrival
            self.marks = {"in": self.clock()}

    def response_sent(self) -> None:
        self.mark("out", first=False)
        if all(name in self.marks for pair in SEGMENTS.values() for name in pair):
            self.calls.append(dict(self.marks))

    def dump(self) -> None:
        calls, reserve = self.calls[len(self.calls) // 5:], self.reserve_s[len(self.reserve_s) // 5:]  # warm-up out
        now = thread_cpu()
        report: dict[str, Any] = {
            "calls": len(calls),
            **{name: _median_us([c[b] - c[a] for c in calls]) for name, (a, b) in SEGMENTS.items()},
            "reserve_median_us": _median_us(reserve),
            "reserve_p90_us": _quantile_us(reserve, 0.9),
            "draws": self.draws, "draws_waiting_for_the_commit": self.waits,
            "thread_cpu_s": {name: round(now[name] - self.cpu_at_start.get(name, 0.0), 4) for name in now},
        }
        self.out.write_text(json.dumps(report, indent=2) + "\n")
        self.calls, self.reserve_s, self.draws, self.waits, self.cpu_at_start = [], [], 0, 0, now


def _median_us(values: list[float]) -> float | None:
    return round(statistics.median(values) * 1e6, 1) if values else None


def _quantile_us(values: list[float], q: float) -> float | None:
    return round(sorted(values)[int(len(values) * q)] * 1e6, 1) if values else None


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread, by its Python name (from /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        cpu[thread.name] = cpu.get(thread.name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return cpu


def _wrap(owner: type, name: str, before: Callable[..., None] | None = None, after: Callable[..., None] | None = None) -> None:
    original = getattr(owner, name)

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(self, *args)
        result = original(self, *args, **kwargs)
        if after is not None:
            after(self, *args)
        return result

    setattr(owner, name, wrapped)


def install(probe: Probe) -> None:
    from gateway.accounting.ahead import HoldsAhead
    from gateway.accounting.books import Accounting
    from gateway.serving.h1_connection import H1ServerConnection
    from gateway.serving.h1_exchange import Exchange
    from gateway.upstreams.h1_protocol import H1Connection

    _wrap(H1ServerConnection, "data_received", before=lambda *_: probe.request_arrived())
    _wrap(H1Connection, "send", before=lambda *_: probe.mark("up_out"))
    _wrap(H1Connection, "data_received", before=lambda *_: probe.mark("up_in"))

    send = Exchange.send

    async def traced_send(self: Any, message: Any) -> None:
        await send(self, message)
        if message["type"] == "http.response.body":
            probe.mark("first_out")
            if not message.get("more_body", False):
                probe.response_sent()

    Exchange.send = traced_send  # type: ignore[method-assign]

    reserve = Accounting.reserve

    async def timed_reserve(self: Any, *args: Any) -> None:
        start = time.perf_counter()
        try:
            await reserve(self, *args)
        finally:
            probe.reserve_s.append(time.perf_counter() - start)

    Accounting.reserve = timed_reserve  # type: ignore[method-assign]

    def count_draw(self: HoldsAhead, key: Any, *_: Any) -> None:
        probe.draws += 1
        if key in self._making and key not in self._ready:  # nothing ready: it waits for the refill
            probe.waits += 1

    _wrap(HoldsAhead, "draw", before=count_draw)


def main() -> int:
    probe = Probe(Path(os.environ["PROBE_OUT"]))
    install(probe)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        probe.dump()

    signal.signal(signal.SIGUSR1, on_signal)
    from gateway.cli import main as gateway_main

    return gateway_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
