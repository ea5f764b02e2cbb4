"""A forward HTTP proxy for tests, in the test's own event loop: plain requests in
absolute form (`POST http://host:port/path`) and `CONNECT host:port` tunnels, with its
own name table, so a test can name an upstream host that only the proxy can resolve.

Written here rather than taken from a package: the test needs the name table and a
count of what passed through, and no proxy package is in the lock file."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from urllib.parse import urlsplit


class ForwardProxy:
    def __init__(self, names: dict[str, str]) -> None:
        self._names = names  # host name -> address the proxy connects to
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.seen: list[str] = []  # the request lines it forwarded

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    def _resolve(self, host: str) -> str:
        return self._names.get(host, host)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, _, rest = head.partition(b"\r\n")
            method, target, version = line.decode("latin-1").split(" ", 2)
            self.seen.append(f"{method} {target}")
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                up_reader, up_writer = await asyncio.open_connection(self._resolve(host), int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                parts = urlsplit(target)
                assert parts.hostname is not None
                up_reader, up_writer = await asyncio.open_connection(self._resolve(parts.hostname), parts.port or 80)
                path = parts.path + (f"?{parts.query}" if parts.query else "")
                up_writer.write(f"{method} {path} {version}\r\n".encode("latin-1") + rest)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()
            self._tasks.discard(task)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    finally:
        sink.transport.abort()
