"""Hot reload: the live policy is swapped atomically when the file changes; a bad edit
is logged and rejected, and the last good policy keeps serving."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from gateway.accounting.prices import PriceCatalog
from gateway.routing.loader import PolicyInvalid, load_policy_file
from gateway.routing.resolved import RuntimePolicy

log = logging.getLogger("gateway.policy")


class PolicyHolder:
    def __init__(self, path: Path, catalog: PriceCatalog | None = None,
                 on_swap: Callable[[RuntimePolicy], None] | None = None,
                 on_result: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.catalog = catalog
        self._on_swap = on_swap
        self._on_result = on_result
        self.last_error: str | None = None
        self._digest = ""
        self.current = self._load()  # a bad file at start-up is fatal: raise
        self._digest = self._file_digest()
        self._swap(self.current)

    def _file_digest(self) -> str:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return ""

    def _load(self) -> RuntimePolicy:
        return RuntimePolicy(load_policy_file(self.path, self.catalog), str(self.path))

    def _swap(self, runtime: RuntimePolicy) -> None:
        if self._on_swap is not None:
            self._on_swap(runtime)
        self.current = runtime

    def reload_if_changed(self) -> bool:
        """Returns True when a new policy went live."""
        digest = self._file_digest()
        if not digest or digest == self._digest:
            return False
        self._digest = digest
        try:
            runtime = self._load()
        except PolicyInvalid as exc:
            self.last_error = str(exc)
            log.error("policy reload rejected; still serving the last good policy:\n%s", exc)
            self._report("rejected")
            return False
        self._swap(runtime)
        self.last_error = None
        log.info("policy reloaded from %s", self.path)
        self._report("ok")
        return True

    def _report(self, result: str) -> None:
        if self._on_result is not None:
            self._on_result(result)

    async def watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.reload_if_changed()
            except Exception:  # a watcher that dies silently would freeze the policy
                log.exception("policy watcher error")
