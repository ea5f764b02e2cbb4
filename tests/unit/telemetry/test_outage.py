"""An outage's log: one line when it starts, a summary at most every interval while it
lasts, one line when it ends - however many operations fail meanwhile."""

from __future__ import annotations

import logging

import pytest

from gateway.telemetry.outage import OutageLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_long_outage_costs_a_handful_of_lines(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    outage = OutageLog(logging.getLogger("test.outage"), "ledger database", summary_every_s=60, clock=clock)
    caplog.set_level(logging.INFO, logger="test.outage")
    for second in range(300):  # five minutes down, 100 failures a second
        clock.now = 1000.0 + second
        for _ in range(100):
            outage.failed(ConnectionError("refused"), "failed commits")
        outage.failed(ConnectionError("refused"), "settlements spooled for replay")
    assert outage.down
    clock.now += 1
    outage.recovered()
    outage.recovered()  # nothing more to say
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 + 4 + 1  # down, a summary a minute, back up
    assert lines[0].startswith("the ledger database is unavailable (ConnectionError: refused)")
    assert caplog.records[0].exc_info is not None  # the first error's traceback, once
    assert "30000 failed commits, 300 settlements spooled for replay" in lines[-1]
    assert not outage.down


def test_nothing_is_logged_while_all_is_well(caplog: pytest.LogCaptureFixture) -> None:
    outage = OutageLog(logging.getLogger("test.outage"), "ledger database")
    caplog.set_level(logging.INFO, logger="test.outage")
    outage.recovered()
    assert caplog.records == []
