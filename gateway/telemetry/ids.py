"""Request ids: unique across processes and restarts without a system call per request
(a random per-process prefix and a counter)."""

from __future__ import annotations

import itertools
import secrets


class IdSource:
    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._counter = itertools.count(1)

    def next(self, kind: str = "req") -> str:
        return f"{kind}_{self._prefix}{next(self._counter):08x}"
