"""FX conversions against the rate snapshot they cite: which legs are the conversion, and whether their amounts
follow the rate. Pure, integers only (a rate is a fraction of two ints, never a float).

**Which legs are the conversion.** The FX desk converts: ``sys:fx:<CUR>`` (any shard of it) takes money in one
currency and pays out the other. A transaction naming a snapshot of the pair BASE/QUOTE must move money through
the desk in both: the desk's net in one of the two currencies is positive (what it took) and in the other
negative (what it paid out). Legs elsewhere (a fee to ``sys:fees``, a customer's own legs) are not part of the
conversion, so a fee in the same transaction does not disturb the check.

**The rounding rule.** The amount paid out is the amount taken times the rate (BASE -> QUOTE) or divided by
it (QUOTE -> BASE, the same snapshot read the other way), in minor units of its currency, rounded to a whole
minor unit either way: ``floor(exact) <= paid <= ceil(exact)``. That admits the exact product and each of the
roundings the ``fx_converted`` rule offers (``exact``, ``down``, ``up``), and nothing a whole minor unit or
more away from the rate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from streams.core.model import RateSnapshot
from streams.core.rejections import Rejection

# The FX desk's accounts: sys:fx:<CUR>, sharded as sys:fx:<CUR>@<partition> by the engine.
FX_DESK_PREFIX = "sys:fx:"
# A rate as recorded: units of quote per unit of base, an exact positive decimal string.
_RATE = re.compile(r"([0-9]+)(?:\.([0-9]+))?", re.ASCII)


def fx_account(currency: str) -> str:
    """The FX desk's account in currency (the rules write it; the engine routes it to the local shard)."""
    return f"{FX_DESK_PREFIX}{currency}"


def valid_rate(text: str) -> bool:
    """A positive exact decimal string: "0.925", "150", "1.0". No sign, exponent or spaces."""
    return _RATE.fullmatch(text) is not None and text.strip("0.") != ""


def rate_fraction(text: str) -> tuple[int, int]:
    """A valid rate as (numerator, denominator), exactly: "0.925" -> (925, 1000)."""
    match = _RATE.fullmatch(text)
    assert match is not None, f"not a rate: {text!r}"
    whole, fraction = match.group(1), match.group(2) or ""
    return int(whole + fraction), 10 ** len(fraction)


def judge_snapshot(snapshot: RateSnapshot | None, snapshot_id: str, at_ms: int,
                   currencies: Iterable[str]) -> tuple[Rejection, str] | None:
    """The snapshot a transaction names was recorded, is fresh at at_ms and is for currencies the legs are in
    (fail closed); None when it is. currencies: the currencies of the transaction's legs."""
    if snapshot is None:
        return (Rejection.UNKNOWN_RATE, f"rate snapshot {snapshot_id} was not recorded")
    if at_ms >= snapshot.expires_at_ms:
        return (Rejection.STALE_RATE, f"rate snapshot {snapshot.snapshot_id} expired at {snapshot.expires_at_ms}")
    touched = set(currencies)
    if not {snapshot.base, snapshot.quote} <= touched:
        return (Rejection.RATE_MISMATCH, f"rate snapshot {snapshot.snapshot_id} is for {snapshot.base}/"
                                         f"{snapshot.quote}, the legs are in {'/'.join(sorted(touched))}")
    return None


def _within_one_unit(paid: int, num: int, den: int) -> bool:
    """floor(num/den) <= paid <= ceil(num/den), for positive den."""
    low, rest = divmod(num, den)
    return low <= paid <= (low + 1 if rest else low)


def judge_conversion(snapshot: RateSnapshot, scales: dict[str, int],
                     legs: Iterable[tuple[str, str, int]]) -> tuple[Rejection, str] | None:
    """None when the desk legs of a transaction follow snapshot's rate, else (amount_off_rate, why).

    scales: the decimals of the snapshot's two currencies; legs: (account id, its currency, signed amount).
    """
    base, quote = snapshot.base, snapshot.quote
    net = {base: 0, quote: 0}
    for account_id, currency, amount in legs:
        if currency in net and account_id.startswith(FX_DESK_PREFIX):
            net[currency] += amount
    num, den = rate_fraction(snapshot.rate)
    base_unit, quote_unit = 10 ** scales[base], 10 ** scales[quote]
    if net[base] > 0 and net[quote] < 0:  # took base, paid quote: paid = taken x rate
        taken, paid, source, target = net[base], -net[quote], base, quote
        exact_num, exact_den = taken * num * quote_unit, den * base_unit
    elif net[quote] > 0 and net[base] < 0:  # took quote, paid base: paid = taken / rate
        taken, paid, source, target = net[quote], -net[base], quote, base
        exact_num, exact_den = taken * den * base_unit, num * quote_unit
    else:
        return (Rejection.AMOUNT_OFF_RATE,
                f"rate snapshot {snapshot.snapshot_id} ({base}/{quote}) names a conversion, but the FX desk "
                f"({FX_DESK_PREFIX}{base}, {FX_DESK_PREFIX}{quote}) nets {net[base]} {base} and {net[quote]} {quote}")
    if _within_one_unit(paid, exact_num, exact_den):
        return None
    low = exact_num // exact_den
    expected = str(low) if exact_num % exact_den == 0 else f"{low} or {low + 1}"
    return (Rejection.AMOUNT_OFF_RATE,
            f"the FX desk took {taken} {source} and paid {paid} {target}; at rate {snapshot.rate} of "
            f"{snapshot.snapshot_id} it pays {expected} (minor units)")
