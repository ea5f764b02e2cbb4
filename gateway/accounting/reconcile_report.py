"""The reconciliation report: one row per group with the ledger's and the provider's
amounts and the reasons they differ, its totals, and its two forms - JSON for machines
(`to_json`) and a text table for people (`to_text`, which `gateway reconcile` prints:
ledger/provider in each column, the reasons for a difference under each row, then
totals and notes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any

from gateway.accounting.money import usd
from gateway.accounting.reconcile_explain import REASONS, Amounts, Explanation, signed_usd

MATCHED = "matched"
# A thousandth of a micro-dollar per group: far above float noise in a provider's USD
# amounts, far below anything finance would chase.
DEFAULT_COST_TOLERANCE_PICO = 1_000


@dataclass(frozen=True, slots=True)
class Window:
    """[start, end) in UTC. Whole days (a usage report) compare day by day; a shorter
    window (two metric scrapes) compares as one period dated by its start."""

    start: datetime
    end: datetime
    whole_days: bool

    @classmethod
    def of(cls, since: date | datetime, until: date | datetime) -> Window:
        whole = not isinstance(since, datetime) and not isinstance(until, datetime)
        start, end = _utc(since), _utc(until)
        if end <= start:
            raise ValueError(f"the window is empty: {start.isoformat()} is not before {end.isoformat()}")
        return cls(start, end, whole)

    def day_of(self, day: date) -> date:
        return day if self.whole_days else self.start.date()

    def covers(self, day: date) -> bool:
        return self.start.date() <= day < self.end.date() if self.whole_days else True


@dataclass(frozen=True, slots=True)
class ReconciliationRow:
    day: date
    model: str
    key_id: str | None
    ledger: Amounts
    provider: Amounts
    explanations: tuple[Explanation, ...]
    attempts: Mapping[str, int]
    in_ledger: bool
    at_provider: bool
    not_reported: tuple[str, ...] = ()  # fields the source does not report; taken as equal
    provider_cost_estimated: bool = False  # the source reports no cost: its tokens at the gateway's price

    @property
    def difference(self) -> Amounts:
        return self.provider - self.ledger

    @property
    def matched(self) -> bool:
        return not self.explanations

    @property
    def reasons(self) -> list[str]:
        return [e.reason for e in self.explanations] or [MATCHED]

    def as_json(self) -> dict[str, Any]:
        return {
            "day": self.day.isoformat(), "model": self.model, "key_id": self.key_id, "status": MATCHED if self.matched else "different",
            "ledger": self.ledger.as_json(), "provider": self.provider.as_json(), "difference": self.difference.as_json(),
            "reasons": [e.as_json() for e in self.explanations], "ledger_attempts": dict(self.attempts),
            "in_ledger": self.in_ledger, "at_provider": self.at_provider, "not_reported": list(self.not_reported),
            "provider_cost_estimated": self.provider_cost_estimated,
        }


@dataclass(frozen=True, slots=True)
class ReconciliationReport:
    upstream: str
    source: str
    window: Window
    rows: tuple[ReconciliationRow, ...]
    notes: tuple[str, ...] = ()
    cost_tolerance_pico: int = DEFAULT_COST_TOLERANCE_PICO

    @property
    def matched(self) -> bool:
        return all(row.matched for row in self.rows)

    def totals(self) -> dict[str, Amounts]:
        """`ledger`, `provider`, `difference`, and the amount each reason explains."""
        totals = {"ledger": sum((r.ledger for r in self.rows), Amounts()), "provider": sum((r.provider for r in self.rows), Amounts())}
        totals["difference"] = totals["provider"] - totals["ledger"]
        for reason in REASONS:
            explained = [e.amounts for r in self.rows for e in r.explanations if e.reason == reason]
            if explained:
                totals[reason] = sum(explained, Amounts())
        return totals

    def to_json(self) -> dict[str, Any]:
        return {
            "upstream": self.upstream, "source": self.source, "since": self.window.start.isoformat(),
            "until": self.window.end.isoformat(), "by_day": self.window.whole_days, "matched": self.matched,
            "cost_tolerance_usd": usd(self.cost_tolerance_pico), "rows": [row.as_json() for row in self.rows],
            "totals": {name: amounts.as_json() for name, amounts in self.totals().items()}, "notes": list(self.notes),
        }

    def to_text(self) -> str:
        """A table for people: ledger/provider per column, each difference's reasons under its row."""
        return "\n".join(render(self))


def _utc(value: date | datetime) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return datetime.combine(value, time(0), tzinfo=UTC)


def render(report: ReconciliationReport) -> list[str]:
    w = report.window
    period = (f"UTC days {w.start.date()} up to (not including) {w.end.date()}" if w.whole_days
              else f"{w.start.isoformat(timespec='seconds')} to {w.end.isoformat(timespec='seconds')}")
    lines = [f"Reconciliation of upstream `{report.upstream}` against {report.source}, {period}", ""]
    table = [["DAY", "MODEL", "KEY", "REQUESTS", "INPUT TOKENS", "CACHED", "OUTPUT TOKENS", "COST USD", "DIFFERENCE USD", "RESULT"]]
    details: dict[int, list[str]] = {}
    for row in report.rows:
        led, prov = row.ledger, row.provider
        table.append([row.day.isoformat(), row.model, row.key_id or "-", f"{led.requests}/{prov.requests}",
                      f"{led.input_tokens}/{prov.input_tokens}", f"{led.cached_tokens}/{prov.cached_tokens}",
                      f"{led.output_tokens}/{prov.output_tokens}", f"{usd(led.cost_pico)}/{usd(prov.cost_pico)}",
                      signed_usd(row.difference.cost_pico), ", ".join(row.reasons)])
        extra = [f"  - {e.describe()}" for e in row.explanations]
        unknown = {k: n for k, n in row.attempts.items() if k != "booked" and n}
        if unknown:
            extra.append("    ledger attempts without usage: " + ", ".join(f"{n} {k}" for k, n in sorted(unknown.items())))
        if row.not_reported:
            extra.append(f"    not in the provider's report (taken as equal): {', '.join(row.not_reported)}")
        details[len(table) - 1] = extra
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for index, cells in enumerate(table):
        lines.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip())
        lines.extend(details.get(index, []))
    if not report.rows:
        lines.append("(neither the ledger nor the provider has usage in this period)")
    totals = report.totals()
    led, prov, diff = totals["ledger"], totals["provider"], totals["difference"]
    lines += ["", "Columns are ledger/provider.",
              f"Total: {led.requests}/{prov.requests} requests, {led.input_tokens}/{prov.input_tokens} input tokens, "
              f"{led.output_tokens}/{prov.output_tokens} output tokens, ${usd(led.cost_pico)}/${usd(prov.cost_pico)} "
              f"(difference {signed_usd(diff.cost_pico)})"]
    lines += [f"  {Explanation(reason, totals[reason]).describe()}" for reason in REASONS if reason in totals]
    lines += [f"Note: {note}" for note in report.notes]
    different = sum(not row.matched for row in report.rows)
    lines.append("All groups matched." if not different else f"{different} of {len(report.rows)} groups differ.")
    return lines
