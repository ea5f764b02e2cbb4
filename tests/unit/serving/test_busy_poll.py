"""Busy-polling after a lone call's steps: it keeps the loop turning only while one call
is in flight and its window lasts, and the loop still serves sockets and timers meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from gateway.serving.busy_poll import BusyPoll
from gateway.settings import Settings
from tests.unit.serving.conftest import Run

WINDOW_S = 0.001


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_lone_call_keeps_the_loop_polling_until_its_window_passes(run: Run) -> None:
    async def scenario() -> None:
        clock = Clock()
        poll = BusyPoll(WINDOW_S, lambda: 1, clock)
        poll.touch()
        await turns(20)
        assert poll.polling
        clock.now += WINDOW_S / 2
        poll.touch()  # a step of the call: the window starts again
        clock.now += WINDOW_S * 0.9
        await turns(5)
        assert poll.polling
        clock.now += WINDOW_S
        await turns(2)
        assert not poll.polling  # nothing happened for the window: the loop may sleep again

    run(scenario())


def test_two_calls_in_flight_are_not_polled_for(run: Run) -> None:
    async def scenario() -> None:
        in_flight = 2
        poll = BusyPoll(WINDOW_S, lambda: in_flight, Clock())
        poll.touch()
        await turns(2)
        assert not poll.polling
        in_flight = 1
        poll.touch()
        await turns(2)
        assert poll.polling
        in_flight = 2  # another call came in: the loop has work of its own to turn to
        await turns(2)
        assert not poll.polling

    run(scenario())


def test_a_zero_window_turns_it_off(run: Run) -> None:
    async def scenario() -> None:
        poll = BusyPoll(0, lambda: 1, Clock())
        poll.touch()
        await turns(2)
        assert not poll.polling

    run(scenario())


def test_sockets_and_timers_are_served_while_polling(run: Run) -> None:
    async def scenario() -> None:
        in_flight = 1
        poll = BusyPoll(WINDOW_S, lambda: in_flight, Clock())  # the clock stands still: it would poll for ever

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readexactly(5))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        poll.touch()
        try:
            async with asyncio.timeout(10):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"hello")
                assert await reader.readexactly(5) == b"hello"
                writer.close()
                fired = asyncio.Event()
                asyncio.get_running_loop().call_later(0.01, fired.set)
                await fired.wait()
            assert poll.polling
        finally:
            in_flight = 2  # stops it
            server.close()
            await server.wait_closed()

    run(scenario())


def test_the_window_is_set_in_microseconds_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_BUSY_POLL_US", "250")
    assert Settings().gateway_busy_poll_us == 250
    monkeypatch.setenv("GATEWAY_BUSY_POLL_US", "-1")
    with pytest.raises(ValueError, match="gateway_busy_poll_us"):
        Settings()
