"""A minimal HTTP/1.1 keep-alive client on raw asyncio streams, for the load generator.

The request bytes are built once per run, so the client's own cost per request is a
write, a header parse and a body read - far below httpx's (see README.md). It speaks
just enough HTTP for the two local servers it talks to: Content-Length and chunked
bodies, keep-alive, `Connection: close`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# Called with each body chunk as it arrives (streams) or the whole body (others).
OnChunk = Callable[[bytes], None]


class ProtocolError(Exception):
    """The server's reply is not the HTTP/1.1 this client understands."""


def build_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status code and lower-cased headers from the bytes up to the blank line."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"bad status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class Http1Connection:
    """One keep-alive connection to 127.0.0.1; one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        if host != "127.0.0.1":
            raise ValueError("the benchmarks only talk to 127.0.0.1")
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        return self._reader, self._writer

    async def request(self, raw_request: bytes, on_chunk: OnChunk) -> int:
        """Send prebuilt request bytes, feed the body to `on_chunk`, return the status."""
        status, _ = await self.exchange(raw_request, on_chunk)
        return status

    async def exchange(self, raw_request: bytes, on_chunk: OnChunk) -> tuple[int, dict[str, str]]:
        """Like `request`, also returning the response headers. Any exception leaves the
        connection closed, to be reopened on the next call."""
        try:
            reader, writer = await self._connect()
            writer.write(raw_request)
            status, headers = parse_head(await reader.readuntil(b"\r\n\r\n"))
            await self._read_body(reader, headers, on_chunk)
        except BaseException:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers

    async def _read_body(self, reader: asyncio.StreamReader, headers: dict[str, str], on_chunk: OnChunk) -> None:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")  # no trailers from these servers
                    return
                chunk = await reader.readexactly(size + 2)
                on_chunk(chunk[:-2])
        elif "content-length" in headers:
            on_chunk(await reader.readexactly(int(headers["content-length"])))
        else:
            on_chunk(await reader.read())
            self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
