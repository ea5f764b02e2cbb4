"""Money units. The ledger counts integer pico-dollars (1e-12 USD); people read USD."""

from __future__ import annotations

from decimal import Decimal

PICO_PER_USD = 10**12


def usd(pico: int, places: int = 6) -> str:
    """Exact decimal string, at least `places` decimals, more when needed: never a float."""
    value = Decimal(pico).scaleb(-12).normalize()
    exponent = value.as_tuple().exponent
    digits = max(places, -exponent if isinstance(exponent, int) else places)
    return f"{value:.{digits}f}"


def pico_from_usd(amount: Decimal | str) -> int:
    value = Decimal(str(amount)) * PICO_PER_USD
    if value != value.to_integral_value():
        raise ValueError(f"{amount} USD is finer than a pico-dollar")
    return int(value)
