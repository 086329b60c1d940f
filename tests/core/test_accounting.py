"""Account types, their normal balance direction and the trial balance fold, with exact numbers."""
from __future__ import annotations

from streams.core import AccountType
from streams.core.accounting import TrialBalanceLine, default_account_type, trial_balance

from .ledger_dsl import run


def test_normal_balance_direction():
    # custody holding 40,000 has posted -40,000 (every deposit debits it) and reads +40,000 as an asset
    assert AccountType.ASSET.normal_balance(-40_000) == 40_000
    assert AccountType.LIABILITY.normal_balance(40_000) == 40_000
    assert AccountType.REVENUE.normal_balance(12) == 12 and AccountType.EXPENSE.normal_balance(-5) == 5
    assert [t.value for t in AccountType if t.debit_normal] == ["asset", "expense"]


def test_types_by_name():
    assert default_account_type("sys:custody:USDT@3") is AccountType.ASSET
    assert default_account_type("sys:fees:BTC") is AccountType.REVENUE
    assert default_account_type("sys:world:USD@0") is AccountType.EQUITY
    assert default_account_type("sys:something-new:USD") is AccountType.ASSET
    assert default_account_type("user:42:receivable.USDT") is AccountType.ASSET
    assert default_account_type("user:42:USDT") is AccountType.LIABILITY


def test_an_opened_account_keeps_its_type_through_every_change():
    ledger = run("""
open custody:USDT USDT neg         | ok
open alice:USDT USDT               | ok
transfer d1 custody:USDT->alice:USDT 40000 | ok
hold h1 alice:USDT 100             | ok
freeze alice:USDT                  | ok
""")
    # opened without a type: by name (the DSL's names are not sys: accounts, so both are liabilities)
    assert ledger.state.accounts["alice:USDT"].account_type is AccountType.LIABILITY
    assert ledger.state.history_of("alice:USDT")[0].metadata == (("account_type", "liability"),)


def test_trial_balance_by_currency_and_type():
    lines = [TrialBalanceLine("sys:custody:USDT", "USDT", AccountType.ASSET, -40_000),
             TrialBalanceLine("user:alice:USDT", "USDT", AccountType.LIABILITY, 28_020),
             TrialBalanceLine("user:bob:USDT", "USDT", AccountType.LIABILITY, 11_968),
             TrialBalanceLine("sys:fees:USDT", "USDT", AccountType.REVENUE, 12),
             TrialBalanceLine("sys:custody:BTC", "BTC", AccountType.ASSET, -20),
             TrialBalanceLine("user:bob:BTC", "BTC", AccountType.LIABILITY, 21),
             TrialBalanceLine("sys:expenses:BTC", "BTC", AccountType.EXPENSE, -1)]
    btc, usdt = trial_balance(lines)
    assert (usdt.currency, usdt.debit, usdt.credit, usdt.balanced) == ("USDT", 40_000, 40_000, True)
    assert [(t.account_type.value, t.debit, t.credit, t.balance) for t in usdt.types] == [
        ("asset", 40_000, 0, 40_000), ("liability", 0, 39_988, 39_988), ("revenue", 0, 12, 12)]
    assert [line.account_id for line in usdt.lines][0] == "sys:custody:USDT"
    assert (btc.debit, btc.credit, btc.balanced) == (21, 21, True)
    assert [(t.account_type.value, t.balance) for t in btc.types] == [("asset", 20), ("liability", 21), ("expense", 1)]
    (unbalanced,) = trial_balance([TrialBalanceLine("a", "USD", AccountType.ASSET, -5),
                                   TrialBalanceLine("b", "USD", AccountType.LIABILITY, 4)])
    assert not unbalanced.balanced
