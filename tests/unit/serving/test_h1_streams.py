"""The gateway's HTTP/1.1 server protocol streaming responses: pieces forwarded as sent,
hang-ups heard, slow readers, HTTP/1.0."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.serving import h1_exchange
from gateway.serving.h1_exchange import HANG_UP
from tests.support.h1_wire import GUARD_S, connect, last_reply, post, read_all, read_reply, serving
from tests.unit.serving.conftest import Run

# -- streams -----------------------------------------------------------------------------


def test_each_streamed_piece_reaches_the_client_before_the_next_is_sent(run: Run) -> None:
    pieces = [b"data: %d\n\n" % n for n in range(4)]

    async def scenario() -> None:
        go = [asyncio.Event() for _ in pieces]

        async def streaming(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await read_all(receive)
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
            for piece, event in zip(pieces, go, strict=True):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                await event.wait()
            await send({"type": "http.response.body", "body": b""})

        async with serving(streaming) as (port, _):
            reader, writer = await connect(port)
            writer.write(post("/s", b""))
            async with asyncio.timeout(GUARD_S):
                head = await reader.readuntil(b"\r\n\r\n")
                assert b"transfer-encoding: chunked\r\n" in head
                for piece, event in zip(pieces, go, strict=True):
                    assert await reader.readuntil(b"\r\n") == b"%x\r\n" % len(piece)
                    assert await reader.readexactly(len(piece) + 2) == piece + b"\r\n"
                    event.set()
                assert await reader.readexactly(5) == b"0\r\n\r\n"
            writer.close()

    run(scenario())


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_a_stream_s_head_reaches_the_client_while_the_app_waits_for_its_first_piece(run: Run, version: str) -> None:
    piece = b"data: 0\n\n"
    # Chunked to an HTTP/1.1 client; to an HTTP/1.0 one, the body runs to the close.
    rest = b"9\r\n%s\r\n0\r\n\r\n" % piece if version == "1.1" else piece

    async def scenario() -> None:
        head_read = asyncio.Event()

        async def thinking(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await read_all(receive)
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
            await head_read.wait()  # the first piece comes only once the client has the head
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        async with serving(thinking) as (port, _):
            reader, writer = await connect(port)
            writer.write(b"POST /s HTTP/%s\r\nhost: t\r\ncontent-length: 0\r\n\r\n" % version.encode())
            async with asyncio.timeout(GUARD_S):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 OK\r\n")
                head_read.set()
                assert await reader.readexactly(len(rest)) == rest
            writer.close()

    run(scenario())


def test_a_stream_s_head_leaves_in_one_write_with_a_first_piece_that_comes_soon(
        run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    # Longer than any stall between two turns of the loop, so that "soon" is certain here.
    monkeypatch.setattr(h1_exchange, "STREAM_HEAD_WAIT_S", GUARD_S)
    piece = b"data: 0\n\n"

    async def scenario() -> None:
        writes: list[bytes] = []
        servers: list[Any] = []

        async def quick(scope: dict[str, Any], receive: Any, send: Any) -> None:
            conn = next(iter(servers[0].server_state.connections))
            write = conn.write

            def counted(data: bytes) -> None:
                writes.append(data)
                write(data)

            conn.write = counted
            await read_all(receive)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(3):
                await asyncio.sleep(0)  # a few turns of the loop: the head waits meanwhile
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        async with serving(quick) as (port, server):
            servers.append(server)
            reader, writer = await connect(port)
            writer.write(post("/s", b""))
            reply = await read_reply(reader)
            assert reply.chunks == [piece]
            assert len(writes) == 2 and writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
            assert writes[0].endswith(b"\r\n\r\n9\r\n%s\r\n" % piece)  # head and first piece together
            writer.close()

    run(scenario())


def test_the_app_is_called_back_when_its_client_hangs_up(run: Run) -> None:
    async def scenario() -> None:
        called = asyncio.Event()
        gone = asyncio.get_running_loop().create_future()

        async def streaming(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await read_all(receive)
            hang_up = scope["extensions"][HANG_UP]
            assert hang_up(called.set) is True
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            await called.wait()
            gone.set_result(hang_up(called.set))  # the client is gone now: no callback taken

        async with serving(streaming) as (port, _):
            async with asyncio.timeout(GUARD_S):
                await hang_up_after_first_piece(port)
                assert await gone is False

    run(scenario())


def test_the_app_hears_of_a_client_that_hangs_up_mid_stream(run: Run) -> None:
    async def scenario() -> None:
        heard = asyncio.get_running_loop().create_future()

        async def streaming(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await read_all(receive)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            heard.set_result((await receive())["type"])
            await send({"type": "http.response.body", "body": b"dropped", "more_body": True})  # not an error

        async with serving(streaming) as (port, _):
            async with asyncio.timeout(GUARD_S):
                await hang_up_after_first_piece(port)
                assert await heard == "http.disconnect"

    run(scenario())


async def hang_up_after_first_piece(port: int) -> None:
    """Ask for a stream, read up to its piece `first`, then drop the connection."""
    reader, writer = await connect(port)
    writer.write(post("/s", b""))
    await reader.readuntil(b"first\r\n")
    writer.transport.abort()


def test_a_slow_reader_gets_every_byte_of_a_long_stream_in_order(run: Run) -> None:
    piece = bytes(range(256)) * 256  # 64 KiB a piece, 32 MiB in all: the app must wait for the client

    async def scenario() -> None:
        async def flood(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for n in range(512):
                await send({"type": "http.response.body", "body": n.to_bytes(4, "big") + piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

        async with serving(flood) as (port, _):
            reader, writer = await connect(port)
            writer.write(b"GET /flood HTTP/1.1\r\nhost: t\r\n\r\n")
            reply = await read_reply(reader)
            assert [c[:4] for c in reply.chunks] == [n.to_bytes(4, "big") for n in range(512)]
            assert all(c[4:] == piece for c in reply.chunks)
            writer.close()

    run(scenario())


def test_an_http_1_0_client_gets_a_stream_delimited_by_the_close(run: Run) -> None:
    async def streaming(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})

    async def scenario() -> None:
        reply = await last_reply(streaming, b"GET / HTTP/1.0\r\n\r\n")  # the close ends the body
        assert reply.body == b"ab" and "transfer-encoding" not in reply.headers
        assert reply.headers["connection"] == "close"

    run(scenario())
