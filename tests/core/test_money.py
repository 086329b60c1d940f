"""P9: exact parse / format of decimal strings, with a table and a Hypothesis round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core import (
    DEFAULT_CURRENCIES,
    MAX_ABS_AMOUNT,
    Currency,
    CurrencyRegistry,
    Leg,
    PostTransaction,
    Rejection,
    format_amount,
    parse_amount,
)
from tests.core.budget import examples

USD = DEFAULT_CURRENCIES.get("USD")
JPY = DEFAULT_CURRENCIES.get("JPY")
BTC = DEFAULT_CURRENCIES.get("BTC")
ETH = DEFAULT_CURRENCIES.get("ETH")
USDT = DEFAULT_CURRENCIES.get("USDT")

PARSE_TABLE = [
    ("12.34", USD, 1234),
    ("-12.34", USD, -1234),
    ("0", USD, 0),
    ("-0", USD, 0),
    ("0.01", USD, 1),
    ("12.3", USD, 1230),
    ("12", USD, 1200),
    ("007.50", USD, 750),
    ("1.500", USD, 150),  # extra trailing zeros change no value: accepted
    ("1.501", USD, Rejection.PRECISION_EXCEEDED),
    ("0.001", USD, Rejection.PRECISION_EXCEEDED),
    ("1.5", JPY, Rejection.PRECISION_EXCEEDED),
    ("1.0", JPY, 1),
    ("1000", JPY, 1000),
    ("0.00000001", BTC, 1),
    ("0.000000001", BTC, Rejection.PRECISION_EXCEEDED),
    ("59900", USDT, 59_900_000000),
    ("1.000000000000000001", ETH, 10**18 + 1),
    ("123456789.123456789123456789", ETH, 123456789123456789123456789),
    ("", USD, Rejection.INVALID_AMOUNT),
    ("-", USD, Rejection.INVALID_AMOUNT),
    (".5", USD, Rejection.INVALID_AMOUNT),
    ("5.", USD, Rejection.INVALID_AMOUNT),
    ("+5", USD, Rejection.INVALID_AMOUNT),
    (" 5", USD, Rejection.INVALID_AMOUNT),
    ("5 ", USD, Rejection.INVALID_AMOUNT),
    ("5\n", USD, Rejection.INVALID_AMOUNT),
    ("1e3", USD, Rejection.INVALID_AMOUNT),
    ("1_000", USD, Rejection.INVALID_AMOUNT),
    ("1,5", USD, Rejection.INVALID_AMOUNT),
    ("١٢", USD, Rejection.INVALID_AMOUNT),  # non-ASCII digits
    ("NaN", USD, Rejection.INVALID_AMOUNT),
    ("--1", USD, Rejection.INVALID_AMOUNT),
    (str(MAX_ABS_AMOUNT), JPY, MAX_ABS_AMOUNT),
    ("-" + str(MAX_ABS_AMOUNT), JPY, -MAX_ABS_AMOUNT),
    (str(MAX_ABS_AMOUNT + 1), JPY, Rejection.AMOUNT_OUT_OF_RANGE),
    ("9" * 50, USD, Rejection.AMOUNT_OUT_OF_RANGE),
    ("9" * 50 + ".001", USD, Rejection.AMOUNT_OUT_OF_RANGE),  # range outranks precision
]


@pytest.mark.parametrize(("text", "currency", "expected"), PARSE_TABLE)
def test_parse_table(text: str, currency: Currency, expected: int | Rejection) -> None:
    got = parse_amount(text, currency)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    ("minor", "currency", "text"),
    [(-1234, USD, "-12.34"), (5, USD, "0.05"), (0, USD, "0.00"), (-5, USD, "-0.05"), (1230, USD, "12.30"),
     (5, JPY, "5"), (-5, JPY, "-5"), (1, ETH, "0.000000000000000001"), (11_980_000000, USDT, "11980.000000")],
)
def test_format_table(minor: int, currency: Currency, text: str) -> None:
    assert format_amount(minor, currency) == text


def test_floats_are_programmer_errors() -> None:
    with pytest.raises(TypeError):
        format_amount(1.5, USD)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        parse_amount(1.5, USD)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Leg("a", 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Leg("a", True)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        PostTransaction(command_id="c", client_id="x", at_ms=1.0, transaction_id="t",  # type: ignore[arg-type]
                        legs=(Leg("a", -1), Leg("b", 1)))


def test_registry() -> None:
    assert DEFAULT_CURRENCIES.get("XYZ") is None
    extended = DEFAULT_CURRENCIES.with_currency(Currency("XYZ", 4))
    assert extended.get("XYZ") == Currency("XYZ", 4) and DEFAULT_CURRENCIES.get("XYZ") is None
    assert extended.with_currency(Currency("XYZ", 4)).get("XYZ").scale == 4
    with pytest.raises(ValueError):
        extended.with_currency(Currency("XYZ", 2))  # re-scaling would corrupt stored amounts
    with pytest.raises(ValueError):
        Currency("", 2)
    with pytest.raises(ValueError):
        CurrencyRegistry([Currency("A", 1), Currency("A", 2)])
    assert [(c.code, c.scale) for c in DEFAULT_CURRENCIES] == [
        ("USD", 2), ("EUR", 2), ("JPY", 0), ("BTC", 8), ("USDT", 6), ("ETH", 18)]


@settings(max_examples=examples(1000), deadline=None)
@given(minor=st.integers(-MAX_ABS_AMOUNT, MAX_ABS_AMOUNT), scale=st.integers(0, 36))
def test_format_then_parse_round_trips(minor: int, scale: int) -> None:
    currency = Currency("X", scale)
    assert parse_amount(format_amount(minor, currency), currency) == minor


@settings(max_examples=examples(500), deadline=None)
@given(minor=st.integers(-MAX_ABS_AMOUNT, MAX_ABS_AMOUNT), scale=st.integers(0, 36), pad=st.integers(0, 5))
def test_parse_accepts_padding_zeros_and_refuses_extra_digits(minor: int, scale: int, pad: int) -> None:
    currency = Currency("X", scale)
    text = format_amount(minor, currency)
    padded = text + ("." if scale == 0 and pad else "") + "0" * pad
    assert parse_amount(padded, currency) == minor
    extra = text + ("." if scale == 0 else "") + "0" * pad + "1"
    assert parse_amount(extra, currency) is Rejection.PRECISION_EXCEEDED


@settings(max_examples=examples(300), deadline=None)
@given(text=st.text(max_size=30), scale=st.integers(0, 18))
def test_parse_never_crashes_and_results_are_exact(text: str, scale: int) -> None:
    currency = Currency("X", scale)
    got = parse_amount(text, currency)
    if not isinstance(got, Rejection):
        assert type(got) is int and abs(got) <= MAX_ABS_AMOUNT
        assert parse_amount(format_amount(got, currency), currency) == got


def test_leading_zeros_do_not_count_as_digits() -> None:
    """The 40-digit guard counts significant digits: fifty leading zeros are still 1 USD."""
    assert parse_amount("0" * 50 + "1", USD) == 100
    assert parse_amount("-" + "0" * 50 + "1.5", USD) == -150


def test_programmer_errors_name_the_argument() -> None:
    with pytest.raises(TypeError, match=r"^minor must be an int, got float: 1\.0$"):
        format_amount(1.0, USD)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^text must be a str, got int: 5$"):
        parse_amount(5, USD)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^currency A registered twice with different scales$"):
        CurrencyRegistry([Currency("A", 1), Currency("A", 2)])


def test_the_registry_shows_its_currencies() -> None:
    assert repr(DEFAULT_CURRENCIES) == "CurrencyRegistry(USD:2, EUR:2, JPY:0, BTC:8, USDT:6, ETH:18)"
    assert repr(CurrencyRegistry()) == "CurrencyRegistry()"
