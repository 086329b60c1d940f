"""Account types by name and the trial balance: the books as an accountant reads them. Pure.

The type of an account is chosen when it is opened (OpenAccount.account_type). System accounts open
themselves, so their type comes from their name (``sys:<name>:<CUR>``) through SYSTEM_ACCOUNT_TYPES; an
account opened by a command without a type is a customer balance the operator owes: a liability.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from streams.core.model import AccountType
from streams.core.settlement import RECEIVABLE_MARK

# The metadata key of an account_opened history entry that records the account's type, so a fold of history
# (rebuild-balances, the read side) knows it without the worker's state.
ACCOUNT_TYPE_KEY = "account_type"

# The type of each system account the ledger and its rules use, by name. Clearing is money in transit between
# partitions (an asset that nets to zero); world is the outside of the books that deposits in tests and demos
# come from (equity: the opening balances).
SYSTEM_ACCOUNT_TYPES: dict[str, AccountType] = {
    "custody": AccountType.ASSET,
    "clearing": AccountType.ASSET,
    "liquidity": AccountType.ASSET,
    "fx": AccountType.ASSET,
    "receivable": AccountType.ASSET,
    "in_transit": AccountType.ASSET,
    "fees": AccountType.REVENUE,
    "world": AccountType.EQUITY,
    "equity": AccountType.EQUITY,
    "expenses": AccountType.EXPENSE,
}


def default_account_type(account_id: str) -> AccountType:
    """The type of an account opened without one: a system account's by its name (asset when the name is not
    in the table), a receivable (``<owner>:receivable.<CUR>``) an asset, anything else a liability."""
    if account_id.startswith("sys:"):
        name = account_id[4:].split(":", 1)[0]
        return SYSTEM_ACCOUNT_TYPES.get(name, AccountType.ASSET)
    if account_id.rpartition(":")[2].startswith(RECEIVABLE_MARK):
        return AccountType.ASSET
    return AccountType.LIABILITY


@dataclass(frozen=True, slots=True)
class TrialBalanceLine:
    """One account (system accounts summed over their shards) in the trial balance."""

    account_id: str
    currency: str
    account_type: AccountType
    posted: int  # as of the report's time, the ledger's sign (negative = debit balance)

    @property
    def debit(self) -> int:
        return -self.posted if self.posted < 0 else 0

    @property
    def credit(self) -> int:
        return self.posted if self.posted > 0 else 0


@dataclass(frozen=True, slots=True)
class TypeTotal:
    """Debits and credits of one account type in one currency, and their net in the type's normal direction."""

    account_type: AccountType
    debit: int
    credit: int

    @property
    def balance(self) -> int:
        return self.account_type.normal_balance(self.credit - self.debit)


@dataclass(frozen=True, slots=True)
class CurrencyTrialBalance:
    currency: str
    lines: tuple[TrialBalanceLine, ...]  # by account id
    types: tuple[TypeTotal, ...]  # by type, in AccountType order, only types present

    @property
    def debit(self) -> int:
        return sum(line.debit for line in self.lines)

    @property
    def credit(self) -> int:
        return sum(line.credit for line in self.lines)

    @property
    def balanced(self) -> bool:
        """Σ debits = Σ credits: P1 (every currency sums to zero), as an accountant checks it."""
        return self.debit == self.credit


def trial_balance(lines: Iterable[TrialBalanceLine]) -> tuple[CurrencyTrialBalance, ...]:
    """Group account lines by currency (sorted) and total them by account type."""
    by_currency: dict[str, list[TrialBalanceLine]] = {}
    for line in lines:
        by_currency.setdefault(line.currency, []).append(line)
    report = []
    for currency in sorted(by_currency):
        ordered = tuple(sorted(by_currency[currency], key=lambda line: line.account_id))
        totals = []
        for account_type in AccountType:
            of_type = [line for line in ordered if line.account_type is account_type]
            if of_type:
                totals.append(TypeTotal(account_type, sum(line.debit for line in of_type),
                                        sum(line.credit for line in of_type)))
        report.append(CurrencyTrialBalance(currency, ordered, tuple(totals)))
    return tuple(report)
