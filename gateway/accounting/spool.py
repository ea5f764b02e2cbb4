"""When the ledger database cannot take a settlement, the settlement is appended to a
local spool file (fsynced) and replayed once the database is back: an answer the
client already has is never lost from the books.

Replicas may share one var directory (a shared volume; in separate containers they are
often all pid 1), so every name a process writes carries an identity unique across hosts
and restarts - `<host>-<pid>-<token>`, the token drawn once per SettlementSpool:

- `ledger-spool-<host>-<pid>-<token>.jsonl`: settlements waiting to be booked;
- `<spool name without .jsonl>.replaying-<host>-<pid>-<token>`: a file claimed (by renaming
  it) for replay;
- `ledger-rejected-<host>-<pid>-<token>.jsonl`: lines that can never be booked - torn by a
  crash mid-write, or refused by the database as invalid - set aside for an operator, so
  they do not hold back the lines after them.

A process replays its own spool file; another's, and a claim, only once their process is
gone: at once if it ran on this host and its pid no longer exists, otherwise (another
host, a pid alive but perhaps reused, a name that cannot be read) once the file has gone
`stale_after_s` without being touched; a live replay touches its claim before every line. Names of the previous version
(`ledger-spool-<pid>.jsonl`, `.replaying-<pid>`, taken to be this host's) are still replayed.

Replay is idempotent: events already booked (same request and attempt) are skipped,
and a hold that has already ended is not charged twice."""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.accounting.ledger import Ledger
from gateway.accounting.writer import LedgerUnavailable
from gateway.types.budget import Hold

log = logging.getLogger("gateway.ledger")
PATTERN = "ledger-spool-*.jsonl"
CLAIMED = "ledger-spool-*.replaying-*"
CLAIM = ".replaying-"
# A claim nobody has touched for this long is abandoned. Well above a replay's pause
# between two lines, and above the clock skew between hosts sharing the volume.
STALE_AFTER_S = 600.0
# PEP 249 names for a statement the database refused on its content, not for being down.
REFUSED_AS_INVALID = {"IntegrityError", "DataError"}


class SettlementSpool:
    def __init__(self, directory: Path, *, host: str | None = None, stale_after_s: float = STALE_AFTER_S) -> None:
        self.directory = directory
        self.stale_after_s = stale_after_s
        host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname() if host is None else host)
        self.host = host.replace(CLAIM, "_replaying-") or "unknown"  # names must split at CLAIM unambiguously
        self.identity = f"{self.host}-{os.getpid()}-{secrets.token_hex(4)}"
        self.path = directory / f"ledger-spool-{self.identity}.jsonl"

    def write(self, holds: list[Hold], charged_pico: int, tokens_used: int, events: list[dict[str, Any]], now: datetime) -> None:
        record = {
            "holds": [[h.id, h.amount_pico, h.tokens, list(h.budget_ids)] for h in holds],
            "charged_pico": charged_pico, "tokens_used": tokens_used, "now": now.isoformat(),
            "events": [{k: v.isoformat() if isinstance(v, datetime) else v for k, v in e.items()} for e in events],
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        self._append(self.path, [orjson.dumps(record)])

    def pending(self) -> list[Path]:
        """This process's spool file, and spool files and claims whose writer or
        claimer is gone. A live replica's own spool file is left to it: it may be
        appending to it right now, and a line written after another process had read
        the file would be deleted with the claim."""
        if not self.directory.exists():
            return []
        spooled = [p for p in self.directory.glob(PATTERN)
                   if p == self.path or self._abandoned(p, p.name.removeprefix("ledger-spool-").removesuffix(".jsonl"))]
        claims = [p for p in self.directory.glob(CLAIMED) if self._abandoned(p, p.name.rpartition(CLAIM)[2])]
        return sorted([*spooled, *claims])

    async def replay(self, ledger: Ledger) -> int:
        """Book every spooled settlement; returns how many were booked. A file is
        claimed by renaming it, so replicas sharing the folder do not replay it twice."""
        booked = 0
        for path in self.pending():
            claimed = self.directory / f"{path.name.partition(CLAIM)[0].removesuffix('.jsonl')}{CLAIM}{self.identity}"
            if claimed.exists() and claimed != path:
                continue  # our own earlier claim of a same-named file, left by an error: renaming would overwrite it
            try:
                path.rename(claimed)
                lines = claimed.read_bytes().splitlines()
            except OSError:
                continue  # another process claimed it
            for i, line in enumerate(lines):
                # A rename keeps the old mtime, and a slow but live replay must never look abandoned.
                if not _touch(claimed):
                    break  # taken over as stale after all; the new claimer replays it, idempotently
                try:
                    await _replay_line(ledger, _record(line))
                except LedgerUnavailable as exc:
                    if not _refused_as_invalid(exc):
                        log.warning("ledger still unavailable; %d spooled settlements wait", len(lines) - i)
                        self._append(self.path, lines[i:])
                        claimed.unlink(missing_ok=True)
                        return booked
                    self._reject(line, exc)
                    continue
                except Exception as exc:  # unreadable, or fields that do not make a settlement
                    self._reject(line, exc)
                    continue
                booked += 1
            claimed.unlink(missing_ok=True)
        return booked

    def _abandoned(self, path: Path, owner: str) -> bool:
        """Whether the process that wrote or claimed `path` (`owner`: its identity) is gone."""
        host, pid, _token = owner.rsplit("-", 2) if owner.count("-") >= 2 else ("", "", "")
        if owner.isdigit():  # the previous version's `<pid>` names, which assumed one host
            host, pid = self.host, owner
        if host == self.host and pid.isdigit() and not _pid_alive(int(pid)):
            return True
        # Another host's pids cannot be checked from here, and a pid alive here may be
        # another process by now (or this one, restarted with the same host name): such a
        # file is abandoned once nobody has touched it for stale_after_s. Taking over a
        # claim whose claimer is in fact alive, or two processes both taking one over, is
        # safe: replay is idempotent, so every line is still booked exactly once.
        try:
            return time.time() - path.stat().st_mtime > self.stale_after_s
        except FileNotFoundError:
            return False  # claimed or finished meanwhile

    def _reject(self, line: bytes, reason: Exception) -> None:
        rejected = self.directory / f"ledger-rejected-{self.identity}.jsonl"
        log.error("a spooled settlement cannot be booked (%s); kept in %s for an operator", reason, rejected)
        self._append(rejected, [line])

    @staticmethod
    def _append(path: Path, lines: list[bytes]) -> None:
        with path.open("ab") as handle:
            handle.write(b"\n".join(lines) + b"\n")
            handle.flush()
            os.fsync(handle.fileno())


def _record(line: bytes) -> dict[str, Any]:
    record = orjson.loads(line)  # a torn line raises here
    if not isinstance(record, dict) or not {"holds", "charged_pico", "tokens_used", "events", "now"} <= record.keys():
        raise ValueError("not a spooled settlement")
    return record


def _touch(claim: Path) -> bool:
    """Mark a claim as being replayed; False if it is gone (taken over)."""
    try:
        os.utime(claim)
    except FileNotFoundError:
        return False
    except OSError:
        pass  # e.g. another user's file on a shared volume: it may be taken over as stale, which is safe
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # somebody else's process, or not a pid at all: leave it to staleness
    return True


def _refused_as_invalid(exc: LedgerUnavailable) -> bool:
    cause = exc.__cause__
    return cause is not None and any(c.__name__ in REFUSED_AS_INVALID for c in type(cause).__mro__)


async def _replay_line(ledger: Ledger, record: dict[str, Any]) -> None:
    holds = [Hold(h[0], h[1], h[2], tuple(h[3])) for h in record["holds"]]  # older spools add a fifth field: ignored
    if record.get("unused"):
        await ledger.release_unused(holds, datetime.fromisoformat(record["now"]))
        return
    events = [{k: datetime.fromisoformat(v) if k == "created_at" else v for k, v in e.items()} for e in record["events"]]
    await ledger.settle(holds, record["charged_pico"], record["tokens_used"], events,
                        datetime.fromisoformat(record["now"]), skip_booked=True)
