"""Decimal amounts in currencies registered at runtime, at the edge (`ledger submit`, `ledger import`).

A decimal string ("1.250" XAU) becomes minor units only with the currency's scale, and the scale that counts
is the one every partition registered (RegisterCurrency): converting with another would post amounts 10**k
off. The CLI is told the scale (`--currency XAU:3`) and, before it sends a line, has every partition confirm
it: it sends the registration again (`client.register_currency`, ids `confirm-currency:<code>:<scale>@<partition>`,
apart from the registration's own so that another scale is answered currency_conflict, not id_conflict),
and each partition's single writer answers currency_exists ("known with this scale"; accepted, a duplicate,
when the same confirmation was asked before). currency_conflict (another scale) or any other
refusal stops the command before anything else is sent. A code no partition knew yet is registered by that
confirmation: declaring a scale on the command line is the operator registering it.

Why confirm through the ledger rather than trust the flag or read a list: the partitions' state is the one
home of a registered scale (docs/wallet-operations.md), and a registration is idempotent, so asking it again
is the only question whose answer the ledger itself decides.
"""
from __future__ import annotations

from streams.core import DEFAULT_CURRENCIES, Currency, CurrencyRegistry
from streams.core.money import valid_code

# Answers to a repeated registration that mean "every partition knows it with this scale".
CONFIRMING = frozenset({"currency_exists"})


class CurrencyDeclarationError(ValueError):
    """A --currency value that cannot be used; the message says why."""


def parse_declarations(values: list[str]) -> dict[str, int]:
    """["XAU:3", "XAG:3"] -> {"XAU": 3, "XAG": 3}; a built-in code only with its own scale."""
    declared: dict[str, int] = {}
    for value in values:
        code, sep, scale = value.partition(":")
        if not sep or not valid_code(code) or not scale.isdigit() or not 0 <= int(scale) <= 36:
            raise CurrencyDeclarationError(f"--currency {value!r}: expected CODE:SCALE, e.g. XAU:3 (scale 0..36)")
        known = DEFAULT_CURRENCIES.get(code)
        if known is not None and known.scale != int(scale):
            raise CurrencyDeclarationError(f"--currency {value!r}: {code} is built in with scale {known.scale}")
        if declared.get(code, int(scale)) != int(scale):
            raise CurrencyDeclarationError(f"--currency {code} is declared with two scales")
        declared[code] = int(scale)
    return declared


def registry_with(declared: dict[str, int]) -> CurrencyRegistry:
    """The built-in currencies and the declared ones: what lines are parsed against."""
    registry = DEFAULT_CURRENCIES
    for code, scale in declared.items():
        registry = registry.with_currency(Currency(code, scale))
    return registry


def confirm(client, declared: dict[str, int], timeout_s: float) -> list[str]:
    """Have every partition confirm each declared runtime currency's scale; the refusals, one line each (empty:
    all confirmed). Built-in currencies need no confirmation. Raises ResultTimeout like client.wait."""
    runtime = {code: scale for code, scale in declared.items() if DEFAULT_CURRENCIES.get(code) is None}
    ids = {command_id: code for code, scale in runtime.items()
           for command_id in client.register_currency(code, scale, command_id=f"confirm-currency:{code}:{scale}")}
    if not ids:
        return []
    results = client.wait(list(ids), timeout_s)
    return [f"{ids[command_id]}:{runtime[ids[command_id]]} not confirmed by {command_id}: {r['reason']} ({r['detail']})"
            for command_id, r in results.items() if r["outcome"] != "accepted" and r["reason"] not in CONFIRMING]
