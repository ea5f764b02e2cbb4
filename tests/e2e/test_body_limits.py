"""A request body past its route's limit is refused with a 413 before the gateway holds
it: a declared length at once, a chunked body as it grows past the limit. Measured on a
real `gateway serve` process: a 200 MB upload does not grow its memory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.auth.keys import key_digest, new_api_key
from tests.support.h1_wire import GUARD_S, Reply, connect, read_reply
from tests.support.processes import GatewayProcess

UPLOAD = 200 * 1024 * 1024
CHUNK = 1024 * 1024
ALLOWED_GROWTH = 100 * 1024 * 1024
TASKS_LIMIT = 16 * 1024  # gateway.api.body_limit.SMALL_BODY_BYTES
MAX_BODY = 1024 * 1024  # the policy's defaults.max_body_bytes below


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, str]]:
    tmp = tmp_path_factory.mktemp("limits")
    key = new_api_key()
    policy = tmp / "policy.yaml"
    # Nothing listens at the upstream's or the tool's address: no call gets that far.
    policy.write_text(textwrap.dedent(f"""\
        version: 1
        defaults:
          max_body_bytes: {MAX_BODY}
        upstreams:
          hosted: {{kind: openai, base_url: "http://127.0.0.1:9/v1"}}
        models:
          gpt-4o-mini: {{upstream: hosted, price: {{input: 0.15, output: 0.60}}}}
        tenants:
          acme: {{api_keys: ["{key_digest(key)}"]}}
        tools:
          lookup: {{url: "http://127.0.0.1:9/lookup"}}
        """))
    env = {"DATABASE_URL": f"sqlite:///{tmp / 'ledger.db'}", "GATEWAY_VAR_DIR": str(tmp / "var")}
    proc = GatewayProcess(policy, env, tmp / "gateway.log")
    proc.start()
    try:
        # The first call builds the framework app (gateway.app): its memory is not the upload's.
        opened = httpx.post(f"{proc.url}/v1/tasks", json={"max_calls": 3}, headers={"authorization": f"Bearer {key}"})
        assert opened.status_code == 201, opened.text
        yield proc, key
    finally:
        proc.stop()


def head(path: str, key: str, *fields: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: gateway", f"authorization: Bearer {key}", "content-type: application/json", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def upload_chunked(port: int, path: str, key: str, size: int) -> tuple[Reply, int]:
    """POST `size` bytes in 1 MiB chunks while reading the reply; (the reply, the bytes
    the gateway let the client send before it answered and closed).

    On a bare socket: a stream transport that meets the reset of a closed connection while
    writing drops what it had yet to read, the reply included."""
    loop = asyncio.get_running_loop()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    chunk = b"%x\r\n%s\r\n" % (CHUNK, b" " * CHUNK)
    sent = 0

    async def feed() -> None:
        nonlocal sent
        with contextlib.suppress(ConnectionError):
            await loop.sock_sendall(sock, head(path, key, "transfer-encoding: chunked"))
            while sent < size:
                await loop.sock_sendall(sock, chunk)
                sent += CHUNK
            await loop.sock_sendall(sock, b"0\r\n\r\n")

    async def read() -> Reply:
        received = b""
        while b"\r\n\r\n" not in received or len(received) < _reply_length(received):
            data = await loop.sock_recv(sock, 65536)
            assert data, f"the connection closed before the whole reply came: {received!r}"
            received += data
        head_bytes, _, body = received.partition(b"\r\n\r\n")
        line, *fields = head_bytes.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)}
        return Reply(int(line.split(" ")[1]), headers, body)

    feeding = asyncio.create_task(feed())
    try:
        async with asyncio.timeout(GUARD_S):
            reply = await read()
    finally:
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeding
        sock.close()
    return reply, sent


def _reply_length(received: bytes) -> int:
    """The whole reply's length in bytes, once its head is in (content-length framed)."""
    head_bytes, _, _ = received.partition(b"\r\n\r\n")
    for field in head_bytes.decode("latin-1").split("\r\n")[1:]:
        name, _, value = field.partition(":")
        if name.strip().lower() == "content-length":
            return len(head_bytes) + 4 + int(value)
    raise AssertionError(f"a reply without content-length: {head_bytes!r}")


def peak_rss_reset(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


def memory(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def assert_too_large(reply: Reply) -> None:
    assert reply.status == 413, reply.body
    assert json.loads(reply.body)["error"]["code"] == "request_too_large"
    assert reply.headers.get("connection") == "close", "the rest of the body is not read only to be dropped"


@pytest.mark.parametrize("path", ["/v1/tasks", "/v1/tools/lookup/invoke"])
def test_a_200_mb_chunked_body_is_refused_as_it_passes_the_limit(gateway: tuple[GatewayProcess, str], path: str) -> None:
    proc, key = gateway
    assert proc.proc is not None
    pid = proc.proc.pid
    before = memory(pid, "VmRSS")
    peak_rss_reset(pid)

    reply, sent = asyncio.run(upload_chunked(proc.port, path, key, UPLOAD))

    assert_too_large(reply)
    assert sent < UPLOAD / 4, f"the gateway read {sent} bytes of a body it refused"
    growth = memory(pid, "VmHWM") - before
    assert growth < ALLOWED_GROWTH, f"the gateway's memory grew by {growth / 2**20:.0f} MiB for a refused upload"


@pytest.mark.parametrize("path,declared", [("/v1/tasks", TASKS_LIMIT + 1), ("/v1/tools/lookup/invoke", 500 * 1024 * 1024)])
def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_sent(
        gateway: tuple[GatewayProcess, str], path: str, declared: int) -> None:
    proc, key = gateway

    async def ask() -> Reply:
        reader, writer = await connect(proc.port)
        writer.write(head(path, key, f"content-length: {declared}"))  # and not one byte of the body
        try:
            return await read_reply(reader)
        finally:
            writer.close()

    reply = asyncio.run(ask())
    assert_too_large(reply)
    assert f"{declared} bytes" in json.loads(reply.body)["error"]["message"]


def test_task_bodies_have_a_tighter_limit_than_tool_calls(gateway: tuple[GatewayProcess, str]) -> None:
    proc, key = gateway
    auth = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    padding = b" " * TASKS_LIMIT
    assert httpx.post(f"{proc.url}/v1/tasks", content=b'{"max_calls": 3}', headers=auth).status_code == 201
    assert httpx.post(f"{proc.url}/v1/tasks", content=b'{"max_calls": 3' + padding + b"}", headers=auth).status_code == 413
    # As many bytes are well within what a tool call may send (this tool is unreachable: 502).
    tool = httpx.post(f"{proc.url}/v1/tools/lookup/invoke", content=b'{"arguments": {}' + padding + b"}", headers=auth)
    assert tool.status_code == 502, tool.text
