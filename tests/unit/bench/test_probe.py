"""bench/probe.py: the timestamps on a call's path become the segments c1_split reports."""

from __future__ import annotations

import json
from pathlib import Path

from bench.probe import Probe


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def at(self, us: float) -> Clock:
        self.now = us / 1e6
        return self


def one_call(probe: Probe, clock: Clock, start_us: float, upstream_us: float) -> None:
    probe.request_arrived()
    clock.at(start_us + 30)
    probe.request_arrived()  # the rest of the body: the same arrival
    clock.at(start_us + 200)
    probe.mark("up_out")
    clock.at(start_us + 200 + upstream_us)
    probe.mark("up_in")
    clock.at(start_us + 200 + upstream_us + 10)
    probe.mark("up_in")  # a later read of the same answer does not move its first byte
    clock.at(start_us + 300 + upstream_us)
    probe.mark("first_out")
    clock.at(start_us + 350 + upstream_us)
    probe.mark("first_out")
    probe.response_sent()


def test_calls_split_into_segments_and_the_first_fifth_is_dropped(tmp_path: Path) -> None:
    clock = Clock()
    probe = Probe(tmp_path / "probe.json", clock)
    for number, upstream_us in enumerate([9_000, 500, 400, 600, 500]):  # the first: a cold start, dropped
        one_call(probe, clock.at(number * 100_000), number * 100_000, upstream_us)
    probe.reserve_s += [0.5, 40e-6, 50e-6, 60e-6, 70e-6]

    probe.dump()
    figures = json.loads((tmp_path / "probe.json").read_text())
    assert figures["calls"] == 4
    assert figures["request_to_upstream_us"] == 200.0
    assert figures["upstream_us"] == 500.0  # median of 500, 400, 600, 500
    assert figures["upstream_to_first_write_us"] == 100.0
    assert figures["upstream_to_last_write_us"] == 150.0
    assert figures["reserve_median_us"] == 55.0
    assert "MainThread" in figures["thread_cpu_s"]


def test_a_dump_starts_the_count_over(tmp_path: Path) -> None:
    clock = Clock()
    probe = Probe(tmp_path / "probe.json", clock)
    one_call(probe, clock.at(0), 0, 500)
    probe.draws, probe.waits = 3, 1
    probe.dump()
    probe.dump()
    figures = json.loads((tmp_path / "probe.json").read_text())
    assert figures["calls"] == 0 and figures["upstream_us"] is None
    assert figures["draws"] == 0 and figures["draws_waiting_for_the_commit"] == 0
