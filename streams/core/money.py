"""Exact money: currencies with a registered scale, and decimal strings <-> integer minor units (P9).

Amounts are Python ints of minor units (cents, satoshi, wei). Parsing never rounds: a non-zero digit beyond
the currency's scale is ``precision_exceeded``. Extra trailing zeros ("1.500" USD) are accepted because they
change no value and many systems pad to a fixed width. No float or Decimal is used anywhere on the path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from streams.core._checks import require_int, require_str
from streams.core.rejections import Rejection

# The largest magnitude an amount or a balance may have: the signed 128-bit range (P9).
MAX_ABS_AMOUNT = 2**127 - 1
# Scales above this are refused; 18 (ETH) is the largest in common use, 36 leaves room for odd tokens.
MAX_SCALE = 36
# Optional minus, ASCII digits, optional fraction with at least one digit. No "+", spaces, exponents, "_".
_AMOUNT_RE = re.compile(r"(-?)([0-9]+)(?:\.([0-9]+))?", re.ASCII)
# 2**127 has 39 digits; an integer part longer than this is out of range whatever the scale.
_MAX_WHOLE_DIGITS = 40
# A currency code registered at runtime: it ends account ids (user:42:USDT), so no ':' or '@'.
_CODE_RE = re.compile(r"[A-Za-z0-9_.\-]{1,16}", re.ASCII)


def valid_code(code: str) -> bool:
    """Whether code may name a currency registered at runtime."""
    return _CODE_RE.fullmatch(code) is not None


@dataclass(frozen=True, slots=True)
class Currency:
    """A unit of account and the number of decimals of its minor unit."""

    code: str  # ticker or ISO-4217 code, case-sensitive key of the registry ("USD", "BTC")
    scale: int  # decimals of one minor unit: 2 -> cents, 8 -> satoshi, 18 -> wei

    def __post_init__(self) -> None:
        require_str(self.code, "code")
        require_int(self.scale, "scale")
        if not self.code:
            raise ValueError("currency code must not be empty")
        if not 0 <= self.scale <= MAX_SCALE:
            raise ValueError(f"scale {self.scale} outside 0..{MAX_SCALE}")


class CurrencyRegistry:
    """The currencies the ledger knows. Immutable: with_currency returns a new registry."""

    __slots__ = ("_by_code",)

    def __init__(self, currencies: Iterable[Currency] = ()) -> None:
        by_code: dict[str, Currency] = {}
        for currency in currencies:
            known = by_code.get(currency.code)
            if known is not None and known != currency:
                # Changing a scale would silently rescale every stored amount: a programmer error.
                raise ValueError(f"currency {currency.code} registered twice with different scales")
            by_code[currency.code] = currency
        self._by_code = by_code

    def get(self, code: str) -> Currency | None:
        """The currency for a code, or None if it was never registered."""
        return self._by_code.get(code)

    def with_currency(self, currency: Currency) -> "CurrencyRegistry":
        """A new registry that also knows currency (re-registering the same scale is a no-op)."""
        return CurrencyRegistry((*self._by_code.values(), currency))

    def __iter__(self) -> Iterator[Currency]:
        return iter(self._by_code.values())

    def __contains__(self, code: object) -> bool:
        return code in self._by_code

    def __len__(self) -> int:
        return len(self._by_code)

    def __repr__(self) -> str:
        inner = ", ".join(f"{c.code}:{c.scale}" for c in self._by_code.values())
        return f"CurrencyRegistry({inner})"


# The currencies every deployment starts with; more are added with with_currency.
DEFAULT_CURRENCIES = CurrencyRegistry(
    (
        Currency("USD", 2),
        Currency("EUR", 2),
        Currency("JPY", 0),
        Currency("BTC", 8),
        Currency("USDT", 6),
        Currency("ETH", 18),
    )
)


def parse_amount(text: str, currency: Currency) -> int | Rejection:
    """Convert an exact decimal string to minor units of currency, or say why it cannot be.

    "12.34" USD -> 1234; "-0.5" BTC -> -50000000; "1.500" USD -> 150 (extra zeros are fine);
    "1.234" USD -> PRECISION_EXCEEDED; "1e3", " 1", "+1", "1." -> INVALID_AMOUNT;
    abs >= 2**127 minor units -> AMOUNT_OUT_OF_RANGE (reported before precision, by precedence).
    """
    require_str(text, "text")
    match = _AMOUNT_RE.fullmatch(text)
    if match is None:
        return Rejection.INVALID_AMOUNT
    sign, whole, fraction = match.groups()
    scale = currency.scale
    fraction = fraction or ""
    exceeded = False
    if len(fraction) > scale:
        exceeded = fraction[scale:].strip("0") != ""
        fraction = fraction[:scale]
    whole = whole.lstrip("0")
    if len(whole) > _MAX_WHOLE_DIGITS:
        return Rejection.AMOUNT_OUT_OF_RANGE
    minor = int(whole or "0") * 10**scale + int(fraction.ljust(scale, "0") or "0")
    if minor > MAX_ABS_AMOUNT:
        return Rejection.AMOUNT_OUT_OF_RANGE
    if exceeded:
        return Rejection.PRECISION_EXCEEDED
    return -minor if sign else minor


def format_amount(minor: int, currency: Currency) -> str:
    """Render minor units exactly with the currency's full scale: -1234 USD -> "-12.34", 5 JPY -> "5"."""
    require_int(minor, "minor")
    scale = currency.scale
    sign = "-" if minor < 0 else ""
    digits = str(-minor if minor < 0 else minor)
    if scale == 0:
        return sign + digits
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"
