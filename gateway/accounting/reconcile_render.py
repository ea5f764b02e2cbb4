"""The reconciliation report as text for people, which `gateway reconcile` prints: one line
per group with ledger/provider in each column, the reasons for a difference under it,
then totals and notes. Machines read the report's `to_json`; only the layout is here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.accounting.money import usd
from gateway.accounting.reconcile_explain import REASONS, Explanation, signed_usd

if TYPE_CHECKING:
    # Type-only: reconcile.py imports this module at run time, not the other way round.
    from gateway.accounting.reconcile import ReconciliationReport


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
