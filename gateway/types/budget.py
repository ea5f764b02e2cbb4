"""What a request draws on in the ledger: the budgets it claims and the holds made
against them (accounting/ledger.py makes them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetClaim:
    """A budget a request draws on. `limit_pico` None: use the row's own (tasks)."""

    budget_id: str
    scope: str
    label: str  # for messages: "tenant `acme` (month 2026-11)"
    period_start: str = ""
    limit_pico: int | None = None


@dataclass(frozen=True, slots=True)
class Hold:
    id: str
    amount_pico: int
    tokens: int
    budget_ids: tuple[str, ...]
    # The least any money-limited claim had left once this hold was in (limit - spent -
    # reserved); None when no claim has a money limit. Known when the hold was made.
    headroom_pico: int | None = None
