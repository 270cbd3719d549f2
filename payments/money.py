"""Exact money: USD decimals to token atomic units, always rounded up.

The SDK's dollar-to-atomic helper truncates; a price must never be rounded in the payer's
favour below what the operator asked for, nor ever pass through a float.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal

USDC_DECIMALS = 6


def usd_to_atomic(amount: Decimal, decimals: int = USDC_DECIMALS) -> int:
    """USD (a 1:1 stablecoin) to atomic units, rounded UP to the token's smallest unit."""
    scaled = (amount * (Decimal(10) ** decimals)).to_integral_value(rounding=ROUND_CEILING)
    return int(scaled)


def atomic_to_usd(atomic: int, decimals: int = USDC_DECIMALS) -> Decimal:
    """Atomic units back to an exact USD decimal."""
    return Decimal(atomic).scaleb(-decimals)


def usd_text(amount: Decimal) -> str:
    """`0.0115`: plain decimal text without trailing zeros or exponent."""
    return format(amount.normalize(), "f")


def display_usd(amount: Decimal) -> str:
    """`$0.0115`: the price as the operator wrote it, without float noise or trailing zeros."""
    return f"${usd_text(amount)}"
