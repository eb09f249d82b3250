"""Money in the API: decimal strings at the edges, integer micro-dollars inside. Never a float."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

MICRO = 1_000_000
# Up to a million dollars with at most six decimals: the CRD pattern and the parser agree on this.
USD_PATTERN = r"^(0|[1-9][0-9]{0,6})(\.[0-9]{1,6})?$"


def usd_to_micro(value: str) -> int:
    try:
        amount = Decimal(value)
    except InvalidOperation as exc:
        raise ValueError(f"not a decimal dollar amount: {value!r}") from exc
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"dollar amount must be a finite non-negative decimal: {value!r}")
    micro = amount * MICRO
    if micro != micro.to_integral_value():
        raise ValueError(f"dollar amount has more than six decimals: {value!r}")
    return int(micro)


def micro_to_usd(micro: int) -> str:
    """Exact, with trailing zeros trimmed but at least two decimals: 1_500_000 -> '1.50'."""
    amount = (Decimal(micro) / MICRO).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)
    text = f"{amount:f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}"
