"""What an FX refusal tells the client (streams/core/fx.py judge_conversion), table-driven.

The outcomes (which amounts follow a rate) are checked against Fraction in test_scenarios.py; here, the detail of
an amount_off_rate: a client that sent the wrong amount must be told what the rate pays, and a transaction that
converts nothing at all must be told so, not be given an amount."""
from __future__ import annotations

import pytest

from streams.core.fx import judge_conversion, judge_snapshot
from streams.core.model import RateSnapshot
from streams.core.rejections import Rejection

SCALES = {"USD": 2, "EUR": 2, "JPY": 0}
EXACT = RateSnapshot("s1", "USD", "EUR", "0.925", 0, 1)  # 10.00 USD -> 9.25 EUR exactly
INEXACT = RateSnapshot("s2", "USD", "JPY", "150.25", 0, 1)  # 10.00 USD -> 1502.5 JPY: 1502 or 1503


def desk(base_in: int, quote_out: int, snapshot: RateSnapshot) -> list[tuple[str, str, int]]:
    """The FX desk's legs: it takes base_in of the base currency and pays quote_out of the quote (signed)."""
    return [(f"sys:fx:{snapshot.base}", snapshot.base, base_in), (f"sys:fx:{snapshot.quote}", snapshot.quote,
                                                                    -quote_out)]


ROWS = [
    # id, snapshot, desk legs, None (follows the rate) or the end of the refusal's detail
    ("exact-rate", EXACT, desk(1000, 925, EXACT), None),
    # an exact product admits one amount: the refusal names that one, not two roundings of it
    ("exact-rate-one-short", EXACT, desk(1000, 924, EXACT), "it pays 925 (minor units)"),
    ("exact-rate-one-over", EXACT, desk(1000, 926, EXACT), "it pays 925 (minor units)"),
    ("exact-product-of-an-inexact-looking-rate", INEXACT, desk(400, 600, INEXACT), "it pays 601 (minor units)"),
    # a product between two minor units admits both roundings, and the refusal names both
    ("inexact-rate", INEXACT, desk(1000, 1502, INEXACT), None),
    ("inexact-rate-off", INEXACT, desk(1000, 1504, INEXACT), "it pays 1502 or 1503 (minor units)"),
    # the snapshot read the other way: 1503 JPY / 150.25 = 10.0033 USD
    ("reverse-off", INEXACT, [("sys:fx:JPY", "JPY", 1503), ("sys:fx:USD", "USD", -1002)],
     "it pays 1000 or 1001 (minor units)"),
    # the desk pays out without taking anything in the other currency (or takes without paying): that converts
    # nothing, whichever side is missing; the refusal says what the desk nets instead of an amount
    ("pays-only-quote", EXACT, [("sys:fx:EUR", "EUR", -925)],
     "the FX desk (sys:fx:USD, sys:fx:EUR) nets 0 USD and -925 EUR"),
    ("pays-only-base", EXACT, [("sys:fx:USD", "USD", -1000)],
     "the FX desk (sys:fx:USD, sys:fx:EUR) nets -1000 USD and 0 EUR"),
    ("takes-only-base", EXACT, [("sys:fx:USD", "USD", 1000)],
     "the FX desk (sys:fx:USD, sys:fx:EUR) nets 1000 USD and 0 EUR"),
    ("takes-only-quote", EXACT, [("sys:fx:EUR", "EUR", 925)],
     "the FX desk (sys:fx:USD, sys:fx:EUR) nets 0 USD and 925 EUR"),
]


@pytest.mark.parametrize("snapshot, legs, refusal", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_an_fx_refusal_names_what_the_rate_pays(snapshot, legs, refusal) -> None:
    judged = judge_conversion(snapshot, SCALES, legs)
    if refusal is None:
        assert judged is None
    else:
        assert judged is not None and judged[0] is Rejection.AMOUNT_OFF_RATE
        assert judged[1].endswith(refusal), judged[1]


def test_a_snapshot_for_other_currencies_names_both_pairs() -> None:
    """rate_mismatch says which pair the snapshot is for and which currencies the legs are in."""
    judged = judge_snapshot(EXACT, "s1", 0, ["JPY", "USD", "JPY"])
    assert judged == (Rejection.RATE_MISMATCH, "rate snapshot s1 is for USD/EUR, the legs are in JPY/USD")
