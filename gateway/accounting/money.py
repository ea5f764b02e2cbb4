"""Money units. The ledger counts integer pico-dollars (1e-12 USD); people read USD."""

from __future__ import annotations

from decimal import Decimal

PICO_PER_USD = 10**12


def usd(pico: int, places: int = 6) -> str:
    """Exact decimal string, at least `places` decimals, more when needed: never a float.
    Integer arithmetic: this formats a header on every response."""
    whole, fraction = divmod(abs(pico), PICO_PER_USD)
    decimals = f"{fraction:012d}".rstrip("0").ljust(places, "0")
    return f"{'-' if pico < 0 else ''}{whole}.{decimals}"


def pico_from_usd(amount: Decimal | str) -> int:
    value = Decimal(str(amount)) * PICO_PER_USD
    if value != value.to_integral_value():
        raise ValueError(f"{amount} USD is finer than a pico-dollar")
    return int(value)
