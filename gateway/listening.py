"""The port `serve --workers N` listens on: on Linux, a listening socket per worker.

With one socket shared by every worker, a new connection goes to whichever worker
accepts first, and uvloop accepts every pending connection at once. Clients that open
their pools in a burst (as load balancers and connection pools do) land on the workers
that happened to be awake: `bench/scaleout.py` found a worker with no connection at all
in 4 of 5 rounds of four workers streaming, which then did the work of three. With SO_REUSEPORT
each worker has a socket of its own and Linux spreads connections over them by a hash
of the client's address and port, whatever each worker is doing at that moment.

The price: connections queued to a worker and not yet accepted wait for it if it
stalls, and are reset if it dies (unless `net.ipv4.tcp_migrate_req` is 1), where a
shared socket let another worker take them.

The supervisor binds the port first, so a port another program holds still fails the
command at once, and holds an abstract socket named after the port, so that a second
gateway cannot join the first one's workers on it (SO_REUSEPORT would let it).
"""

from __future__ import annotations

import errno
import socket
import sys
from typing import Any


def supported() -> bool:
    """Linux balances SO_REUSEPORT listeners; other systems hand every connection to one."""
    return sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")


class PerWorkerSocket(socket.socket):
    """Bound in the supervisor and never listened on there. Handed to a worker, it
    arrives as a new socket of that worker's own, bound to the same address."""

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (worker_socket, (self.family, self.getsockname()))


def worker_socket(family: socket.AddressFamily, address: tuple[Any, ...]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    _share_port(sock)
    sock.bind(address)
    return sock


def supervisor_socket(host: str, port: int) -> tuple[PerWorkerSocket, socket.socket]:
    """(the port's socket, the lock that keeps a second gateway off it); raises OSError
    when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = PerWorkerSocket(family, socket.SOCK_STREAM)
    try:
        _share_port(sock)
        sock.bind((host, port))
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(f"\0gateway-serve-{family.name}-{sock.getsockname()[1]}")
        except OSError:
            lock.close()
            raise OSError(errno.EADDRINUSE, f"address already in use: another gateway serves port {sock.getsockname()[1]}") from None
    except OSError:
        sock.close()
        raise
    return sock, lock


def _share_port(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
