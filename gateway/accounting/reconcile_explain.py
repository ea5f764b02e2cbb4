"""Why one group's figures differ: the difference (provider minus ledger) shared out
among the reasons, in the order reconcile.py describes, so that the parts always add
up to it exactly. Pure arithmetic on amounts already summed: the queries and the report
are in reconcile.py, and this is the part that needs reading slowly.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gateway.accounting.money import usd
from gateway.accounting.prices import PICO_PER_TOKEN_AT_ONE_USD, PriceQuote

PENDING, CANCELLED, RETRIED, UNCONFIRMED = "pending", "cancelled", "retried", "unconfirmed"
MISSING_AT_GATEWAY, MISSING_AT_PROVIDER, PRICE_DRIFT = "missing at gateway", "missing at provider", "price drift"
REASONS = (PENDING, CANCELLED, RETRIED, UNCONFIRMED, MISSING_AT_GATEWAY, MISSING_AT_PROVIDER, PRICE_DRIFT)
# Which unknown-usage attempts explain provider-billed requests first: the surest first.
UNKNOWN_USAGE_ORDER = (UNCONFIRMED, PENDING, CANCELLED, RETRIED)


@dataclass(frozen=True, slots=True)
class Amounts:
    requests: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    cost_pico: int = 0
    # Of the input, the cache writes, and of those the 1-hour ones (Anthropic): each has its price.
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))

    def __sub__(self, other: Amounts) -> Amounts:
        return Amounts(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))

    def counts_match(self) -> bool:
        return (self.requests == self.input_tokens == self.cached_tokens == self.output_tokens
                == self.cache_write_tokens == self.cache_write_1h_tokens == 0)

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "cost_usd": usd(self.cost_pico)}


@dataclass(frozen=True, slots=True)
class Explanation:
    reason: str
    amounts: Amounts  # the part of the difference (provider minus ledger) this reason explains

    def as_json(self) -> dict[str, Any]:
        return {"reason": self.reason, **self.amounts.as_json()}

    def describe(self) -> str:
        a = self.amounts
        of_input = ", ".join(p for p in (f"{a.cached_tokens:+d} cached" if a.cached_tokens else "",
                                         f"{a.cache_write_tokens:+d} cache writes" if a.cache_write_tokens else "") if p)
        parts = [f"{a.requests:+d} requests" if a.requests else "",
                 f"{a.input_tokens:+d} input" + (f" ({of_input})" if of_input else "") if a.input_tokens or of_input else "",
                 f"{a.output_tokens:+d} output tokens" if a.output_tokens else "",
                 signed_usd(a.cost_pico)]
        return f"{self.reason}: " + ", ".join(p for p in parts if p)


@dataclass(slots=True)
class LedgerGroup:
    """One (day, model, key) of the ledger: known usage, all cost, and attempts by why."""

    usage: Amounts = Amounts()
    attempts: Counter[str] = field(default_factory=Counter)  # booked | pending | cancelled | retried | unconfirmed | failed
    unconfirmed_cost_pico: int = 0
    unconfirmed_covered: int = 0  # unconfirmed rows whose request's attempts are booked (and counted) already
    estimated_cost_pico: int = 0  # what cut-short attempts (usage never reported) were booked at, estimated

    def explainable(self, reason: str) -> int:
        return self.attempts[reason] - (self.unconfirmed_covered if reason == UNCONFIRMED else 0)


def explain(diff: Amounts, ledger: LedgerGroup | None, at_provider: bool, quote: PriceQuote | None,
            tolerance: int) -> tuple[Explanation, ...]:
    if diff.counts_match() and abs(diff.cost_pico) <= tolerance:
        return ()
    if ledger is None:
        return (Explanation(MISSING_AT_GATEWAY, diff),)
    parts: dict[str, Amounts] = {}

    def add(reason: str, amounts: Amounts) -> None:
        parts[reason] = parts.get(reason, Amounts()) + amounts

    if ledger.unconfirmed_cost_pico:
        add(UNCONFIRMED, Amounts(cost_pico=-ledger.unconfirmed_cost_pico))
    if ledger.estimated_cost_pico:
        # Booked at an estimate; the provider's tokens for these requests, priced below,
        # replace it: the sum is how far the estimate was off.
        add(CANCELLED, Amounts(cost_pico=-ledger.estimated_cost_pico))
    if not at_provider:
        # The whole group is absent: what the ledger booked for it is the difference.
        booked_without_usage = ledger.unconfirmed_cost_pico + ledger.estimated_cost_pico
        add(MISSING_AT_PROVIDER, diff - Amounts(cost_pico=-booked_without_usage))
        return _ordered(parts)
    shares = _request_shares(diff.requests, ledger)
    if diff.requests < 0:
        add(MISSING_AT_PROVIDER, Amounts(requests=diff.requests))
    for reason, n in shares:
        add(reason, Amounts(requests=n))
    for name in ("input_tokens", "cached_tokens", "output_tokens", "cache_write_tokens", "cache_write_1h_tokens"):
        value = getattr(diff, name)
        if value > 0 and shares:
            for (reason, _), part in zip(shares, _split(value, [n for _, n in shares]), strict=True):
                add(reason, Amounts(**{name: part}))
        elif value:
            add(MISSING_AT_GATEWAY if value > 0 else MISSING_AT_PROVIDER, Amounts(**{name: value}))
    if quote is not None:
        for reason, amounts in list(parts.items()):
            parts[reason] = amounts + Amounts(cost_pico=cost_at(quote, amounts))
    residual = diff.cost_pico - sum(a.cost_pico for a in parts.values())
    token_parts = [r for r, a in parts.items() if not a.counts_match()]
    if residual and quote is None and token_parts:
        add(token_parts[0], Amounts(cost_pico=residual))  # no price known: the cost cannot be split
    elif abs(residual) > tolerance or (residual and not parts):
        add(PRICE_DRIFT, Amounts(cost_pico=residual))
    elif residual:
        add(max(parts, key=lambda r: abs(parts[r].cost_pico)), Amounts(cost_pico=residual))  # rounding
    return _ordered(parts)


def _request_shares(requests: int, ledger: LedgerGroup) -> list[tuple[str, int]]:
    """Provider-billed requests the ledger has no usage for, by the attempts that explain them."""
    shares, left = [], requests
    for reason in UNKNOWN_USAGE_ORDER:
        n = min(left, ledger.explainable(reason))
        if n > 0:
            shares.append((reason, n))
            left -= n
    if left > 0:
        shares.append((MISSING_AT_GATEWAY, left))
    return shares


def _ordered(parts: Mapping[str, Amounts]) -> tuple[Explanation, ...]:
    return tuple(Explanation(r, parts[r]) for r in REASONS if r in parts and parts[r] != Amounts())


def _split(total: int, weights: list[int]) -> list[int]:
    """`total` in proportion to `weights`, in integers that add up exactly (largest remainder)."""
    whole = sum(weights)
    shares = [total * w // whole for w in weights]
    by_remainder = sorted(range(len(weights)), key=lambda i: (total * weights[i]) % whole, reverse=True)
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return shares


def cost_at(quote: PriceQuote, amounts: Amounts) -> int:
    """Signed cost of a token difference at `quote` (OpenAI semantics: input includes
    cached and cache-write tokens; of the writes, the 1-hour ones at their own rate)."""
    a = amounts
    exact = (Fraction(a.input_tokens - a.cached_tokens - a.cache_write_tokens) * Fraction(quote.input)
             + Fraction(a.cached_tokens) * Fraction(quote.cached_input)
             + Fraction(a.cache_write_tokens - a.cache_write_1h_tokens) * Fraction(quote.cache_write)
             + Fraction(a.cache_write_1h_tokens) * Fraction(quote.write_1h)
             + Fraction(a.output_tokens) * Fraction(quote.output)) * PICO_PER_TOKEN_AT_ONE_USD
    return round(exact)


def signed_usd(pico: int) -> str:
    return ("+" if pico >= 0 else "-") + "$" + usd(abs(pico))
