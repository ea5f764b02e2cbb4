"""The HTTP/1.1 client against real servers over real loopback sockets, on both event
loops the gateway runs on. Servers wait on events, never on the clock; the only timeouts
under test are small and fire against a server that will never answer."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from gateway.upstreams.h1 import (
    H1ConnectError,
    H1ConnectTimeout,
    H1DeadlinePassed,
    H1Disconnected,
    H1Error,
    H1Pool,
    H1ProtocolError,
    H1Response,
    H1Timeout,
)
from gateway.upstreams.h1_protocol import HIGH_WATER_BYTES, PROBE_AFTER_IDLE_S, H1Connection
from tests.support.raw_http import CHUNKED_HEAD, LAST_CHUNK, RawHttpServer, Received, chunk, response

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
GUARD_S = 10  # bounds every wait on the other side, so a bug fails the test instead of hanging it

Run = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    return uvloop.run if request.param == "uvloop" else asyncio.run  # type: ignore[return-value]


def make_pool(base: str, **overrides: Any) -> H1Pool:
    options: dict[str, Any] = {"default_headers": {"content-type": "application/json", "authorization": "Bearer k"},
                               "max_connections": 4, "keepalive_s": 30.0, "connect_timeout_s": 5.0}
    return H1Pool(base + "/v1", **(options | overrides))


async def ok(request: Received, writer: asyncio.StreamWriter) -> bool:
    writer.write(response(200, b"ok:" + request.body))
    return True


async def post(pool: H1Pool, body: bytes = b"{}", **timeouts: float) -> tuple[int, bytes]:
    reply = await pool.request("POST", "/chat/completions", body, **timeouts)
    return reply.status, await reply.read()


# -- responses -------------------------------------------------------------------------


def test_content_length_response_status_headers_and_body(run: Run) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(response(201, b'{"echo": ' + request.body + b"}",
                              (("X-Multi", "a"), ("x-multi", "b"), ("Content-Type", "application/json"))))
        return True

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            reply = await pool.request("POST", "/chat/completions", b'{"n": 1}', timeout_s=GUARD_S)
            assert reply.status == 201
            assert reply.headers["x-multi"] == "a, b" and reply.headers["content-type"] == "application/json"
            assert not reply.at_eof
            assert await reply.read() == b'{"echo": {"n": 1}}' and reply.at_eof
            sent = server.requests[0]
            assert (sent.method, sent.target) == ("POST", "/v1/chat/completions")
            assert sent.headers["host"] == server.url.removeprefix("http://")
            assert sent.headers["content-length"] == "8" and sent.headers["accept-encoding"] == "identity"
            assert sent.headers["authorization"] == "Bearer k" and sent.headers["content-type"] == "application/json"
            await pool.aclose()

    run(scenario())


def test_chunked_chunks_reach_the_client_one_by_one(run: Run) -> None:
    async def scenario() -> None:
        first_seen = asyncio.Event()
        second_sent = False

        async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
            nonlocal second_sent
            writer.write(CHUNKED_HEAD + chunk(b"data: one\n\n"))
            await first_seen.wait()
            second_sent = True
            writer.write(chunk(b"data: two\n\n") + LAST_CHUNK)
            return True

        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            reply = await pool.request("POST", "/chat/completions", b"{}", read_timeout_s=GUARD_S)
            pieces = []
            async for piece in reply.iter_raw():
                if not pieces:
                    assert piece == b"data: one\n\n" and not second_sent
                    first_seen.set()
                pieces.append(piece)
            assert b"".join(pieces) == b"data: one\n\ndata: two\n\n" and reply.at_eof
            await pool.aclose()

    run(scenario())


def test_chunked_trailer_fields_do_not_change_the_headers(run: Run) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED_HEAD + chunk(b"body") + b"0\r\nx-trailer: late\r\n\r\n")
        return True

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            reply = await pool.request("POST", "/x", b"")
            assert await reply.read() == b"body" and "x-trailer" not in reply.headers
            assert await post(pool) == (200, b"body") and server.connections == 1
            await pool.aclose()

    run(scenario())


def test_body_delimited_by_the_close_is_read_whole_and_not_reused(run: Run) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the ")
        await writer.drain()
        writer.write(b"end")
        return False  # the server closes: that ends the body

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            assert await post(pool) == (200, b"until the end")
            assert await post(pool) == (200, b"until the end")
            assert server.connections == 2
            await pool.aclose()

    run(scenario())


def test_interim_1xx_response_is_skipped(run: Run) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + response(200, b"final"))
        return True

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            reply = await pool.request("POST", "/x", b"")
            assert reply.status == 200 and "link" not in reply.headers
            assert await reply.read() == b"final"
            assert await post(pool) == (200, b"final") and server.connections == 1
            await pool.aclose()

    run(scenario())


# -- keep-alive and the pool limit -------------------------------------------------------


def test_sequential_requests_reuse_one_connection(run: Run) -> None:
    async def scenario() -> None:
        async with RawHttpServer(ok) as server:
            pool = make_pool(server.url)
            for i in range(20):
                assert await post(pool, b"%d" % i, timeout_s=GUARD_S) == (200, b"ok:%d" % i)
            assert server.connections == 1
            await pool.aclose()

    run(scenario())


def test_pool_limit_queues_requests_and_all_succeed(run: Run) -> None:
    async def scenario() -> None:
        two_in_flight = asyncio.Event()
        go = asyncio.Event()
        in_flight = 0

        async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
            nonlocal in_flight
            in_flight += 1
            if in_flight == 2:
                two_in_flight.set()
            await go.wait()
            writer.write(response(200, request.body))
            return True

        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url, max_connections=2)
            tasks = [asyncio.create_task(post(pool, b"%d" % i)) for i in range(6)]
            async with asyncio.timeout(GUARD_S):
                await two_in_flight.wait()
            assert server.connections == 2 and len(server.requests) == 2  # the other four wait in the pool
            go.set()
            assert sorted(await asyncio.gather(*tasks)) == [(200, b"%d" % i) for i in range(6)]
            assert server.connections == 2 and server.max_open == 2
            await pool.aclose()

    run(scenario())


def test_waiting_for_a_slot_is_bounded_and_a_cancelled_waiter_frees_nothing_it_did_not_hold(run: Run) -> None:
    async def scenario() -> None:
        go, slow_arrived = asyncio.Event(), asyncio.Event()

        async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
            if request.body == b"slow":
                slow_arrived.set()
                await go.wait()
            writer.write(response(200, request.body))
            return True

        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url, max_connections=1)
            slow = asyncio.create_task(post(pool, b"slow"))
            async with asyncio.timeout(GUARD_S):
                await slow_arrived.wait()
            with pytest.raises(H1Timeout):
                await post(pool, b"late", timeout_s=0.05)  # the only slot is busy for as long as we like
            cancelled = asyncio.create_task(post(pool, b"cancelled"))
            await asyncio.sleep(0)
            cancelled.cancel()
            go.set()
            assert await slow == (200, b"slow")
            assert await post(pool, b"next", timeout_s=GUARD_S) == (200, b"next")
            assert cancelled.cancelled() and server.connections == 1
            await pool.aclose()

    run(scenario())


def test_idle_connection_closed_by_the_server_is_replaced(run: Run) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(response(200, b"once"))
        writer.write_eof()  # as a server's idle timeout does; we then see the client close too
        return True

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            assert await post(pool) == (200, b"once")
            await server.connection_ended(0)
            assert await post(pool, timeout_s=GUARD_S) == (200, b"once")
            assert server.connections == 2
            await pool.aclose()

    run(scenario())


@pytest.mark.skipif(sys.platform != "linux", reason="reads the server socket's TCP state (Linux TCP_INFO)")
def test_close_the_event_loop_has_not_seen_yet_is_found_before_reuse(run: Run) -> None:
    """The server's FIN lands while our loop is busy; the next request must not be written to that socket."""
    fin_wait_2 = 5  # tcpi_state once the client's kernel has acknowledged the server's FIN
    close_now, closed = threading.Event(), threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(response(200, b"hi"))
                if not closed.is_set():
                    close_now.wait(GUARD_S)
                    conn.shutdown(socket.SHUT_WR)
                    deadline = time.monotonic() + GUARD_S
                    while conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] != fin_wait_2:
                        assert time.monotonic() < deadline
                        time.sleep(0.001)
                    closed.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def scenario() -> None:
        pool = make_pool(f"http://127.0.0.1:{listener.getsockname()[1]}")
        assert await post(pool) == (200, b"hi")
        # From here on the loop is blocked: nothing tells it the connection is closed.
        close_now.set()
        assert closed.wait(GUARD_S)
        time.sleep(PROBE_AFTER_IDLE_S + 0.01)  # noqa: ASYNC251 - the loop must not run, so the close stays unseen (+10 ms: uvloop clock is in ms)
        assert await post(pool, timeout_s=GUARD_S) == (200, b"hi")
        await pool.aclose()

    try:
        run(scenario())
    finally:
        close_now.set()
        listener.close()
        thread.join(GUARD_S)


def test_connection_close_response_is_not_reused(run: Run) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(response(200, b"bye", (("connection", "close"),)))
        return True  # keeps the socket open: the client must be the one to close it

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            assert await post(pool) == (200, b"bye")
            await server.connection_ended(0)
            assert await post(pool) == (200, b"bye")
            assert server.connections == 2
            await pool.aclose()

    run(scenario())


def test_idle_connections_past_keepalive_are_closed_and_replaced(run: Run) -> None:
    async def scenario() -> None:
        async with RawHttpServer(ok) as server:
            pool = make_pool(server.url, keepalive_s=0.05)
            assert await post(pool) == (200, b"ok:{}")
            await asyncio.sleep(0.06)  # idle past keepalive_s: the clock is the point of this test
            assert await post(pool) == (200, b"ok:{}")
            await server.connection_ended(0)
            assert server.connections == 2
            await pool.aclose()

    run(scenario())


# -- timeouts and failures -------------------------------------------------------------


def test_read_timeout_between_chunks(run: Run) -> None:
    async def scenario() -> None:
        async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
            writer.write(CHUNKED_HEAD + chunk(b"data: one\n\n"))
            return True  # and then silence: the server only reads, waiting for the client to go

        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            reply = await pool.request("POST", "/chat/completions", b"{}", read_timeout_s=0.2)
            stream = reply.iter_raw()
            assert await anext(stream) == b"data: one\n\n"
            with pytest.raises(H1Timeout) as caught:
                await anext(stream)
            assert not isinstance(caught.value, H1DeadlinePassed)  # the server went quiet; the request had time left
            await server.connection_ended(0)  # the stalled connection was dropped
            await pool.aclose()

    run(scenario())


def test_request_timeout_ends_a_stream_that_is_still_sending(run: Run) -> None:
    async def scenario() -> None:
        async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
            writer.write(CHUNKED_HEAD)
            for _ in range(100):  # a chunk every 20 ms for 2 s: never a gap long enough to time out
                writer.write(chunk(b"data: more\n\n"))
                await writer.drain()
                await asyncio.sleep(0.02)
            return True

        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            reply = await pool.request("POST", "/chat/completions", b"{}", timeout_s=0.3, read_timeout_s=0.2)
            received = b""
            with pytest.raises(H1DeadlinePassed):
                async for piece in reply.iter_raw():
                    received += piece
            assert received.startswith(b"data: more")  # it streamed until the request's time was up
            await server.connection_ended(0)  # and the connection was dropped, as a vLLM server needs to abort
            await pool.aclose()

    run(scenario())


def test_request_timeout_covers_a_server_that_never_answers(run: Run) -> None:
    async def scenario() -> None:
        async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
            return True  # never answers; only reads, waiting for the client to go

        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            with pytest.raises(H1Timeout) as caught:
                await post(pool, timeout_s=0.2)
            assert isinstance(caught.value, TimeoutError) and not isinstance(caught.value, H1ConnectError)
            await server.connection_ended(0)
            await pool.aclose()

    run(scenario())


def test_connection_refused_is_a_connect_error(run: Run) -> None:
    async def scenario() -> None:
        with socket.socket() as unused:  # bound, never listening: connecting is refused
            unused.bind(("127.0.0.1", 0))
            pool = make_pool(f"http://127.0.0.1:{unused.getsockname()[1]}")
            with pytest.raises(H1ConnectError) as caught:
                await post(pool)
            assert not isinstance(caught.value, H1ConnectTimeout)
            with pytest.raises(H1ConnectError):  # the failed attempt gave its slot back
                await post(pool)
            await pool.aclose()

    run(scenario())


def test_close_mid_stream_disconnects_the_server(run: Run) -> None:
    async def scenario() -> None:
        async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
            writer.write(CHUNKED_HEAD + chunk(b"data: one\n\n"))
            return True  # then reads: the client's close ends the connection

        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url, max_connections=1)
            reply = await pool.request("POST", "/chat/completions", b"{}", read_timeout_s=GUARD_S)
            async for piece in reply.iter_raw():
                assert piece == b"data: one\n\n"
                reply.close()
            await server.connection_ended(0)
            assert not reply.at_eof
            await pool.aclose()

    run(scenario())


def test_server_closing_mid_body_is_a_disconnect(run: Run) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten..")
        return False

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            reply = await pool.request("POST", "/x", b"")
            with pytest.raises(H1Disconnected):
                await reply.read()
            await pool.aclose()

    run(scenario())


@pytest.mark.parametrize("reply", [b"SPAM SPAM SPAM\r\n\r\n", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"])
def test_garbage_response_is_a_protocol_error(run: Run, reply: bytes) -> None:
    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(reply)
        return True

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            with pytest.raises(H1ProtocolError):
                await post(pool)
            await server.connection_ended(0)
            await pool.aclose()

    run(scenario())


def test_aclose_fails_waiters_and_streams_and_closes_sockets(run: Run) -> None:
    async def scenario() -> None:
        async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
            writer.write(CHUNKED_HEAD + chunk(b"data: one\n\n"))
            return True

        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url, max_connections=1)
            stream = await pool.request("POST", "/x", b"")
            waiter = asyncio.create_task(pool.request("POST", "/x", b""))
            await asyncio.sleep(0)
            await pool.aclose()
            with pytest.raises(H1Error):
                await waiter
            with pytest.raises(H1Disconnected):
                await stream.read()
            await server.connection_ended(0)
            with pytest.raises(H1Error):
                await post(pool)

    run(scenario())


def test_invalid_requests_are_refused_before_anything_is_sent() -> None:
    pool = make_pool("http://127.0.0.1:9")
    for method, path in [("POST", "no-slash"), ("POST", "/a b"), ("POST", "/x\r\nevil: 1"), ("HEAD", "/"), ("P OST", "/")]:
        with pytest.raises(ValueError):
            asyncio.run(pool.request(method, path, b""))
    with pytest.raises(ValueError):
        make_pool("http://127.0.0.1:9", default_headers={"x-evil": "a\r\nb: c"})
    with pytest.raises(ValueError):
        make_pool("ftp://127.0.0.1:9")


# -- flow control ------------------------------------------------------------------------


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.written = b""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        raise AssertionError("a healthy stream was aborted")


def test_a_consumer_that_falls_behind_pauses_the_socket_until_it_catches_up() -> None:
    async def scenario() -> None:
        conn = H1Connection(asyncio.get_running_loop())
        transport = RecordingTransport()
        conn.connection_made(transport)
        conn.send(b"POST / HTTP/1.1\r\n\r\n", 0.0, None, None, None)
        conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        piece = b"x" * 65536
        while transport.reading:
            conn.data_received(chunk(piece))
        assert HIGH_WATER_BYTES < len(conn.take()) <= HIGH_WATER_BYTES + len(piece)
        assert transport.reading
        conn.data_received(chunk(piece) + LAST_CHUNK)
        assert conn.take() == piece and conn.complete and transport.reading

    asyncio.run(scenario())


def test_large_stream_arrives_intact_through_pauses(run: Run) -> None:
    payload = bytes(range(256)) * 4096 * 8  # 8 MiB, well past the high-water mark

    async def handler(request: Received, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED_HEAD)
        for start in range(0, len(payload), 100_000):
            writer.write(chunk(payload[start:start + 100_000]))
            await writer.drain()
        writer.write(LAST_CHUNK)
        return True

    async def scenario() -> None:
        async with RawHttpServer(handler) as server:
            pool = make_pool(server.url)
            reply = await pool.request("POST", "/x", b"", read_timeout_s=GUARD_S)
            received = bytearray()
            async for piece in reply.iter_raw():
                received += piece
                await asyncio.sleep(0)  # a consumer that does other work between pieces
            assert received == payload and reply.at_eof
            await pool.aclose()

    run(scenario())


# -- TLS ---------------------------------------------------------------------------------


@pytest.fixture
def self_signed(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    if shutil.which("openssl") is None:
        if IN_CI:
            pytest.fail("openssl is missing; CI must run the TLS test")
        pytest.skip("openssl CLI not found: cannot make a self-signed certificate for the TLS test")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    yield cert, key


def test_https_against_a_self_signed_server(run: Run, self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def scenario() -> None:
        async with RawHttpServer(ok, tls=server_tls) as server:
            assert server.url.startswith("https://")
            pool = make_pool(server.url, ssl_context=ssl.create_default_context(cafile=str(cert)))
            for i in range(3):
                assert await post(pool, b"%d" % i, timeout_s=GUARD_S) == (200, b"ok:%d" % i)
            assert server.connections == 1
            await pool.aclose()
            untrusting = make_pool(server.url)  # the system's default trust store does not know this cert
            with pytest.raises(H1ConnectError):
                await post(untrusting)
            await untrusting.aclose()

    run(scenario())


def test_response_context_manager_releases_the_connection(run: Run) -> None:
    async def scenario() -> None:
        async with RawHttpServer(ok) as server:
            pool = make_pool(server.url, max_connections=1)
            reply: H1Response
            async with await pool.request("POST", "/x", b"a") as reply:
                assert reply.status == 200
            assert await post(pool, timeout_s=GUARD_S) == (200, b"ok:{}")  # not stuck behind the first
            await pool.aclose()

    run(scenario())
