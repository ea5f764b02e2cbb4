"""A streamed reply's relay is cancelled when the client hangs up, whether the relay is
waiting for the upstream or has just sent its first event."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.api.hot_paths import HangUpWatch


class Client:
    """The ASGI receive side of one request: waits until `hang_up`."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.watched = asyncio.Event()
        self.receives = 0

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        self.watched.set()
        await self.gone.wait()
        return {"type": "http.disconnect"}


def test_a_relay_waiting_for_the_upstream_is_cancelled_when_the_client_hangs_up() -> None:
    asyncio.run(_waiting_relay())


async def _waiting_relay() -> None:
    client = Client()
    task = asyncio.ensure_future(relay_until_hang_up(client))
    await asyncio.wait_for(client.watched.wait(), 5)  # the watch is on while the relay waits
    client.gone.set()
    assert await task == "cancelled by the hang-up"


async def relay_until_hang_up(client: Client, hang_up: Any = None, waiting: asyncio.Event | None = None) -> str:
    """A relay whose upstream never sends its first event, watched for the hang-up."""
    watch = HangUpWatch(client.receive, asyncio.current_task(), hang_up)  # type: ignore[arg-type]
    try:
        if waiting is not None:
            waiting.set()
        await asyncio.Event().wait()
        return "finished"
    except asyncio.CancelledError:
        assert watch.fired()
        return "cancelled by the hang-up"
    finally:
        await watch.stop()


def test_a_relay_done_before_the_loop_turns_starts_no_watch() -> None:
    asyncio.run(_relay_done_at_once())


async def _relay_done_at_once() -> None:
    client = Client()

    async def relay() -> bool:
        watch = HangUpWatch(client.receive, asyncio.current_task())  # type: ignore[arg-type]
        await watch.stop()  # everything was in hand: the reply went out without waiting
        return watch.fired()

    assert await relay() is False
    await asyncio.sleep(0)
    assert client.receives == 0


def test_a_cancellation_from_elsewhere_is_not_the_watch_s() -> None:
    asyncio.run(_cancelled_elsewhere())


async def _cancelled_elsewhere() -> None:
    client = Client()
    started = asyncio.Event()

    async def relay() -> None:
        watch = HangUpWatch(client.receive, asyncio.current_task())  # type: ignore[arg-type]
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            assert not watch.fired()
            raise
        finally:
            await watch.stop()

    task = asyncio.ensure_future(relay())
    await started.wait()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class Server:
    """A server that calls the app back on a hang-up (`HANG_UP`), as the gateway's does."""

    def __init__(self, gone: bool = False) -> None:
        self.gone = gone
        self.callback: Any = None

    def hang_up(self, callback: Any) -> bool:
        if self.gone:
            return False
        self.callback = callback
        return True

    def client_leaves(self) -> None:
        self.gone = True
        callback, self.callback = self.callback, None
        callback()


def test_with_the_server_s_callback_the_relay_is_cancelled_without_a_task_reading() -> None:
    asyncio.run(_called_back())


async def _called_back() -> None:
    client, server = Client(), Server()
    waiting = asyncio.Event()

    task = asyncio.ensure_future(relay_until_hang_up(client, server.hang_up, waiting))
    await waiting.wait()
    assert server.callback is not None
    server.client_leaves()
    assert await task == "cancelled by the hang-up"
    assert server.callback is None  # taken back
    assert client.receives == 0


def test_a_client_gone_before_the_watch_cancels_the_relay_at_its_first_wait() -> None:
    asyncio.run(_gone_already())


async def _gone_already() -> None:
    client, server = Client(), Server(gone=True)

    async def relay() -> bool:
        watch = HangUpWatch(client.receive, asyncio.current_task(), server.hang_up)  # type: ignore[arg-type]
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return watch.fired()
        finally:
            await watch.stop()
        return False

    assert await relay() is True
