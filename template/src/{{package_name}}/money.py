"""How money is shown to people (template-owned: copier-agent-worker).

Amounts are Decimals of dollars, exact to the micro-dollar (`spend.to_usd`); JSON carries
them as their exact text. The console and the admin commands show them through `usd`, so
one amount reads the same on both.
"""

from __future__ import annotations

from decimal import Decimal


def usd(value: Decimal | str) -> str:
    """Dollars as text: a dollar sign, at least two decimals, every digit the amount has,
    never an exponent.

    >>> usd(Decimal("6E+1")), usd(Decimal("0.125")), usd(Decimal(0)), usd("0.000079")
    ('$60.00', '$0.125', '$0.00', '$0.000079')
    >>> usd(Decimal("-0.5"))
    '-$0.50'
    """
    amount = Decimal(value)
    whole, _, cents = format(abs(amount), "f").partition(".")
    return f"{'-' if amount < 0 else ''}${whole}.{cents.ljust(2, '0')}"
