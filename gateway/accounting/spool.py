"""When the ledger database cannot take a settlement, the settlement is appended to a
local spool file (fsynced) and replayed once the database is back: an answer the
client already has is never lost from the books.

Replay is idempotent: events already booked (same request and attempt) are skipped,
and a hold that has already ended is not charged twice. A line that can never be
booked - torn by a crash mid-write, or refused by the database as invalid - is moved
to `ledger-rejected-<pid>.jsonl` for an operator, so it does not hold back the lines
after it."""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.accounting.ledger import Hold, Ledger
from gateway.accounting.writer import LedgerUnavailable

log = logging.getLogger("gateway.ledger")
PATTERN = "ledger-spool-*.jsonl"
CLAIMED = "ledger-spool-*.replaying-*"
# PEP 249 names for a statement the database refused on its content, not for being down.
REFUSED_AS_INVALID = {"IntegrityError", "DataError"}


class SettlementSpool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / f"ledger-spool-{os.getpid()}.jsonl"

    def write(self, holds: list[Hold], charged_pico: int, tokens_used: int, events: list[dict[str, Any]], now: datetime) -> None:
        record = {
            "holds": [[h.id, h.amount_pico, h.tokens, list(h.budget_ids)] for h in holds],
            "charged_pico": charged_pico, "tokens_used": tokens_used, "now": now.isoformat(),
            "events": [{k: v.isoformat() if isinstance(v, datetime) else v for k, v in e.items()} for e in events],
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        self._append(self.path, [orjson.dumps(record)])

    def pending(self) -> list[Path]:
        """Spool files to replay, and files a process claimed for replay but died with."""
        if not self.directory.exists():
            return []
        orphaned = [p for p in self.directory.glob(CLAIMED) if not _claimer_alive(p)]
        return sorted([*self.directory.glob(PATTERN), *orphaned])

    async def replay(self, ledger: Ledger) -> int:
        """Book every spooled settlement; returns how many were booked. A file is
        claimed by renaming it, so replicas sharing the folder never replay it twice."""
        booked = 0
        for path in self.pending():
            claimed = path.with_suffix(f".replaying-{os.getpid()}")
            try:
                path.rename(claimed)
            except OSError:
                continue  # another process claimed it
            lines = claimed.read_bytes().splitlines()
            for i, line in enumerate(lines):
                try:
                    await _replay_line(ledger, _record(line))
                except LedgerUnavailable as exc:
                    if not _refused_as_invalid(exc):
                        log.warning("ledger still unavailable; %d spooled settlements wait", len(lines) - i)
                        self._append(self.path, lines[i:])
                        claimed.unlink()
                        return booked
                    self._reject(line, exc)
                    continue
                except Exception as exc:  # unreadable, or fields that do not make a settlement
                    self._reject(line, exc)
                    continue
                booked += 1
            claimed.unlink()
        return booked

    def _reject(self, line: bytes, reason: Exception) -> None:
        rejected = self.directory / f"ledger-rejected-{os.getpid()}.jsonl"
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


def _claimer_alive(path: Path) -> bool:
    pid = path.suffix.removeprefix(".replaying-")
    if not pid.isdigit():
        return True  # not ours to take
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # somebody else's process
    return True


def _refused_as_invalid(exc: LedgerUnavailable) -> bool:
    cause = exc.__cause__
    return cause is not None and any(c.__name__ in REFUSED_AS_INVALID for c in type(cause).__mro__)


async def _replay_line(ledger: Ledger, record: dict[str, Any]) -> None:
    holds = [Hold(h[0], h[1], h[2], tuple(h[3])) for h in record["holds"]]
    events = [{k: datetime.fromisoformat(v) if k == "created_at" else v for k, v in e.items()} for e in record["events"]]
    await ledger.settle(holds, record["charged_pico"], record["tokens_used"], events,
                        datetime.fromisoformat(record["now"]), skip_booked=True)
