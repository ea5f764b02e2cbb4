"""Hot reload: the live policy is swapped atomically when the file changes; a bad edit
is logged and rejected, and the last good policy keeps serving.

The file is read, parsed and checked in a worker thread: however long that takes, the
event loop keeps serving requests (a policy that took 18 s to parse once stalled every
request for as long). Only the swap happens on the loop."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.routing.loader import PolicyCheck, PolicyInvalid, load_policy_file
from gateway.routing.resolved import RuntimePolicy
from gateway.yaml_lines import MAX_FILE_BYTES

log = logging.getLogger("gateway.policy")


@dataclass(frozen=True, slots=True)
class Reload:
    """What reading a changed file gave: a policy to put live, or why it was refused."""

    digest: str
    runtime: RuntimePolicy | None
    error: PolicyInvalid | None


class PolicyHolder:
    def __init__(self, path: Path, check: PolicyCheck | None = None,
                 on_swap: Callable[[RuntimePolicy], None] | None = None,
                 on_result: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.check = check
        self._on_swap = on_swap
        self._on_result = on_result
        self.last_error: str | None = None
        self._digest = ""
        self.current = self._load()  # a bad file at start-up is fatal: raise
        self._digest = self._file_digest()
        self._swap(self.current)

    def _file_digest(self) -> str:
        # Past MAX_FILE_BYTES the loader refuses the file whatever the rest holds: no
        # need to read (or hold) more of it to notice a change.
        try:
            with self.path.open("rb") as file:
                return hashlib.sha256(file.read(MAX_FILE_BYTES + 1)).hexdigest()
        except OSError:
            return ""

    def _load(self) -> RuntimePolicy:
        return RuntimePolicy(load_policy_file(self.path, self.check), str(self.path))

    def _swap(self, runtime: RuntimePolicy) -> None:
        if self._on_swap is not None:
            self._on_swap(runtime)
        self.current = runtime

    def _read_if_changed(self) -> Reload | None:
        """The file's policy, or why it is refused; None when it has not changed. Runs
        in a worker thread: it changes nothing on this holder."""
        digest = self._file_digest()
        if not digest or digest == self._digest:
            return None
        try:
            return Reload(digest, self._load(), None)
        except PolicyInvalid as exc:
            return Reload(digest, None, exc)

    def _apply(self, reload: Reload | None) -> bool:
        if reload is None:
            return False
        self._digest = reload.digest
        if reload.runtime is None:
            self.last_error = str(reload.error)
            log.error("policy reload rejected; still serving the last good policy:\n%s", reload.error)
            self._report("rejected")
            return False
        self._swap(reload.runtime)
        self.last_error = None
        log.info("policy reloaded from %s", self.path)
        self._report("ok")
        return True

    def reload_if_changed(self) -> bool:
        """Read and apply a changed file in this thread. Returns True when a new policy
        went live."""
        return self._apply(self._read_if_changed())

    async def reload_off_loop(self) -> bool:
        """`reload_if_changed`, with the reading and parsing in a worker thread."""
        return self._apply(await asyncio.to_thread(self._read_if_changed))

    def _report(self, result: str) -> None:
        if self._on_result is not None:
            self._on_result(result)

    async def watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.reload_off_loop()
            except Exception:  # a watcher that dies silently would freeze the policy
                log.exception("policy watcher error")
