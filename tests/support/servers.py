"""Run an ASGI app on a real loopback port in a background thread, for tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from gateway.app import GatewayApp
from gateway.serving.protocol import BoundedHttpProtocol

START_TIMEOUT_S = 10.0


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def run_asgi_in_thread(app: Any) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 (a free port) and yield its base URL, e.g. http://127.0.0.1:PORT.

    The socket is bound here (so the port is known) but uvicorn starts listening on it,
    so a successful connect means the server really accepts connections. The gateway is
    served over its own HTTP/1.1 protocol, as `gateway serve` does; other apps (the
    simulators) over uvicorn's, as `gateway sim` does.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http=BoundedHttpProtocol if isinstance(app, GatewayApp) else "httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=2,
        # Longer than client pools keep idle connections, so a loaded test machine does
        # not close a connection just as a client reuses it.
        timeout_keep_alive=30,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"asgi-{port}")
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (server.started and _accepts(port)):
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"server on port {port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
