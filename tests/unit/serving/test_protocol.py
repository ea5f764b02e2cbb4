"""The gateway's HTTP/1.1 server (uvicorn's httptools protocol with bounds on the
request head), on a real loopback socket, on both event loops, driven byte by byte from
a raw client: requests, keep-alive, what is refused, failures and shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.serving.protocol import MAX_HEAD_BYTES, BoundedHttpProtocol
from tests.support.h1_wire import GUARD_S, closed, connect, echo, last_reply, post, read_all, read_reply, serving
from tests.unit.serving.conftest import Run

# -- requests and keep-alive ---------------------------------------------------------------


def test_requests_on_one_connection_are_answered_in_turn_with_what_they_sent(run: Run) -> None:
    async def scenario() -> None:
        async with serving(echo) as (port, _):
            reader, writer = await connect(port)
            for n in range(3):
                writer.write(post("/v1/chat/completions", b'{"n": %d}' % n))
                reply = await read_reply(reader)
                assert (reply.status, reply.body) == (200, b'{"n": %d}' % n)
                assert reply.headers["content-length"] == str(len(reply.body))
                assert reply.headers["x-where"] == "POST /v1/chat/completions /v1/chat/completions ?"
                assert "date" in reply.headers and "connection" not in reply.headers
            writer.close()

    run(scenario())


def test_pipelined_requests_are_answered_in_order(run: Run) -> None:
    async def scenario() -> None:
        async with serving(echo) as (port, _):
            reader, writer = await connect(port)
            writer.write(b"".join(post("/p", b"first-%d" % n) for n in range(5)))
            assert [(await read_reply(reader)).body for _ in range(5)] == [b"first-%d" % n for n in range(5)]
            writer.close()

    run(scenario())


def test_query_and_escaped_path_reach_the_app_as_asgi_says(run: Run) -> None:
    async def scenario() -> None:
        async with serving(echo) as (port, _):
            reader, writer = await connect(port)
            writer.write(b"GET /a%20b/c?x=1&y=%20 HTTP/1.1\r\nhost: t\r\n\r\n")
            assert (await read_reply(reader)).headers["x-where"] == "GET /a b/c /a%20b/c ?x=1&y=%20"
            writer.close()

    run(scenario())


def test_a_chunked_request_body_arrives_whole(run: Run) -> None:
    async def scenario() -> None:
        async with serving(echo) as (port, _):
            reader, writer = await connect(port)
            writer.write(b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"5\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\n\r\n")
            assert (await read_reply(reader)).body == b"hello world"
            writer.close()

    run(scenario())


def test_a_body_larger_than_the_read_buffer_arrives_intact(run: Run) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB: reading pauses and resumes as the app takes it

    async def scenario() -> None:
        async with serving(echo) as (port, _):
            reader, writer = await connect(port)
            writer.write(post("/big", body))
            assert (await read_reply(reader)).body == body
            writer.close()

    run(scenario())


def test_expect_continue_is_answered_only_when_the_app_reads_the_body(run: Run) -> None:
    async def refuse_unread(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/refuse":
            await send({"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
        else:
            await echo(scope, receive, send)

    async def scenario() -> None:
        async with serving(refuse_unread) as (port, _):
            reader, writer = await connect(port)
            writer.write(b"POST /read HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n")
            async with asyncio.timeout(GUARD_S):
                assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"body")
            assert (await read_reply(reader)).body == b"body"
            writer.write(b"POST /refuse HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n")
            assert (await read_reply(reader)).status == 413  # no 100 Continue before it
            writer.write(b"body")  # sent anyway, as clients that stop waiting do: skipped over
            writer.write(post("/after", b"next"))
            assert (await read_reply(reader)).body == b"next"
            writer.close()

    run(scenario())


def test_head_gets_the_headers_without_the_body(run: Run) -> None:
    async def scenario() -> None:
        async with serving(echo) as (port, _):
            reader, writer = await connect(port)
            writer.write(b"HEAD /h HTTP/1.1\r\nhost: t\r\n\r\n" + post("/after", b"next"))
            async with asyncio.timeout(GUARD_S):
                head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 0\r\n" in head
            assert (await read_reply(reader)).body == b"next"  # nothing stray came between them
            writer.close()

    run(scenario())


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(run: Run) -> None:
    async def scenario() -> None:
        async with serving(echo, timeout_keep_alive=0.05) as (port, _):
            reader, writer = await connect(port)
            writer.write(post("/once", b"x"))
            assert (await read_reply(reader)).body == b"x"
            assert await closed(reader)

    run(scenario())


class QuickHeads(BoundedHttpProtocol):
    head_timeout_s = 0.2


def test_a_connection_that_never_sends_a_head_gets_a_408_and_is_closed(run: Run) -> None:
    async def scenario() -> None:
        async with serving(echo, http=QuickHeads) as (port, _):
            silent, _writer = await connect(port)
            reply = await read_reply(silent)
            assert reply.status == 408 and reply.headers["connection"] == "close"
            assert await closed(silent)

    run(scenario())


def test_a_head_dribbled_byte_by_byte_gets_a_408_and_never_reaches_the_app(run: Run) -> None:
    reached: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await echo(scope, receive, send)

    async def scenario() -> None:
        async with serving(app, http=QuickHeads) as (port, _):
            reader, writer = await connect(port)
            head = b"GET /slow HTTP/1.1\r\nhost: t\r\nx-pad: " + b"a" * 1000
            answer = asyncio.create_task(read_reply(reader))
            for byte in head:  # one byte every 10 ms, until the server gives up on it
                if answer.done():
                    break
                writer.write(bytes([byte]))
                await asyncio.sleep(0.01)
            reply = await answer
            assert reply.status == 408
            assert await closed(reader)
            assert reached == []

    run(scenario())


def test_an_app_slower_than_the_head_bound_is_still_answered(run: Run) -> None:
    release = asyncio.Event()

    async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await read_all(receive)
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    async def scenario() -> None:
        async with serving(slow, http=QuickHeads) as (port, _):
            reader, writer = await connect(port)
            writer.write(post("/slow", b"first"))
            await asyncio.sleep(QuickHeads.head_timeout_s * 3)  # past the head bound: it must not fire now
            release.set()
            assert (await read_reply(reader)).body == b"first"
            writer.write(post("/again", b"second"))
            assert (await read_reply(reader)).body == b"second"
            writer.close()

    run(scenario())


# -- what is refused ---------------------------------------------------------------------


def test_bytes_that_are_not_http_get_a_400_and_the_connection_closes(run: Run) -> None:
    async def scenario() -> None:
        reply = await last_reply(echo, b"NOT HTTP AT ALL\r\n\r\n")
        assert reply.status == 400 and b"Invalid HTTP request" in reply.body

    run(scenario())


def test_a_head_over_the_bound_gets_a_431(run: Run) -> None:
    async def scenario() -> None:
        reply = await last_reply(echo, b"GET / HTTP/1.1\r\nx-big: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
        assert reply.status == 431

    run(scenario())


def test_an_upgrade_is_not_served_but_the_request_is_answered(run: Run) -> None:
    async def scenario() -> None:
        async with serving(echo) as (port, _):
            reader, writer = await connect(port)
            writer.write(b"GET /u HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n")
            reply = await read_reply(reader)
            assert reply.status == 200 and reply.headers["x-where"].startswith("GET /u")
            writer.close()

    run(scenario())


def test_bytes_after_a_connection_close_request_are_ignored(run: Run) -> None:
    async def scenario() -> None:
        async with serving(echo) as (port, _):
            reader, writer = await connect(port)
            writer.write(post("/last", b"x", "connection: close") + post("/smuggled", b"y"))
            reply = await read_reply(reader)
            assert reply.body == b"x" and reply.headers["connection"] == "close"
            assert await closed(reader)

    run(scenario())


@pytest.mark.parametrize("header", [(b"x-bad", b"a\r\nx-injected: 1"), (b"x bad", b"v")])
def test_a_header_that_could_split_the_response_is_never_written(run: Run, header: tuple[bytes, bytes]) -> None:
    async def bad(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [header]})
        await send({"type": "http.response.body", "body": b"x"})

    async def scenario() -> None:
        async with serving(bad) as (port, _):
            reader, writer = await connect(port)
            writer.write(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
            async with asyncio.timeout(GUARD_S):
                written = await reader.read()  # whatever comes before the server closes
            assert b"x-injected" not in written and not written.startswith(b"HTTP/1.1 200")

    run(scenario())


def test_an_app_that_fails_before_or_during_its_response(run: Run) -> None:
    async def failing(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/during":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise RuntimeError("boom")

    async def scenario() -> None:
        async with serving(failing) as (port, _):
            reader, writer = await connect(port)
            writer.write(b"GET /before HTTP/1.1\r\nhost: t\r\n\r\n")
            assert (await read_reply(reader)).status == 500
            assert await closed(reader)
            reader, writer = await connect(port)
            writer.write(b"GET /during HTTP/1.1\r\nhost: t\r\n\r\n")
            async with asyncio.timeout(GUARD_S):
                data = await reader.read()  # cut: no last chunk, so the client knows it is incomplete
            assert data.endswith(b"4\r\npart\r\n")

    run(scenario())


def test_graceful_shutdown_lets_the_request_in_progress_finish_then_closes(run: Run) -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        inside = asyncio.Event()

        async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
            inside.set()
            await release.wait()
            await echo(scope, receive, send)

        async with serving(slow) as (port, server):
            reader, writer = await connect(port)
            writer.write(post("/slow", b"done"))
            async with asyncio.timeout(GUARD_S):
                await inside.wait()
            for connection in list(server.server_state.connections):
                connection.shutdown()  # what uvicorn's shutdown asks of every connection first
            release.set()
            reply = await read_reply(reader)
            assert reply.body == b"done" and reply.headers["connection"] == "close"
            assert await closed(reader)

    run(scenario())
