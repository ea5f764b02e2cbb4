"""What each budget had left when this process last held against it.

A hold is sized from the prompt's bound for any tokenizer (tokens/prompt_bound.py).
Where the provider counts with the gateway's tiktoken encoding, that is needed only
while the budget has room for many such holds: an over-sized hold is released at
settle and can only refuse somebody when the budget is nearly spent. Near the end - or
when nothing is known yet, or the budget limits calls or tokens too (tasks) - such a
prompt is counted, so the last dollars go to exactly the requests that fit; any other
prompt keeps its bound, the most its provider could bill. The figure is a lower bound
in practice: settlements only ever give money back, and a stale figure costs one
exact recount after a refusal, never an overspend (the hold itself is the atomic
check in the ledger).
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.types.budget import BudgetClaim

# Hold against the bound only while the budget could take this many such holds.
AMPLE_HOLDS = 1000
MAX_TRACKED = 100_000


class Headroom:
    def __init__(self, ample_holds: int = AMPLE_HOLDS) -> None:
        self.ample_holds = ample_holds
        self._left: dict[str, int] = {}

    def ample(self, claims: Iterable[BudgetClaim], amount_pico: int) -> bool:
        """True when every claim is a plain money budget known to have room to spare."""
        for claim in claims:
            if not claim.scope.startswith("tenant:"):  # tasks can also limit calls and tokens
                return False
            left = self._left.get(claim.budget_id)
            if left is None or left < amount_pico * self.ample_holds:
                return False
        return True

    def record(self, budget_id: str, left_pico: int | None) -> None:
        if left_pico is None:
            self._left.pop(budget_id, None)
            return
        if len(self._left) >= MAX_TRACKED and budget_id not in self._left:
            self._left.clear()  # old periods' budgets; the live ones are relearned on their next hold
        self._left[budget_id] = left_pico

    def forget(self, claims: Iterable[BudgetClaim]) -> None:
        for claim in claims:
            self._left.pop(claim.budget_id, None)
