"""A tiny scenario language for the core, one line per command, TigerBeetle style.

    <command> | <expected result> [| <expected balances>]

Commands (amounts are decimal strings in the account's currency, parsed with parse_amount):
    open ACCT CUR [neg] [overdraft=AMT] [max=AMT] [route=KEY]
    transfer TX FROM->TO AMT              a two-leg PostTransaction
    tx TX ACCT[@HOLD]=AMT[:CUR] ...       any legs (signed amounts; :CUR asserts the leg currency)
    capture TX HOLD FROM->TO AMT          FROM@HOLD=-AMT, TO=+AMT
    hold HOLD ACCT AMT [expires=MS]
    release HOLD | expire HOLD | freeze ACCT | unfreeze ACCT | close ACCT
    reverse TX ORIGINAL ACCT              a ReverseTransaction of ORIGINAL, routed by ACCT
    register CODE SCALE                   a RegisterCurrency (the ledger's registry grows when accepted)
    rate SNAPSHOT BASE QUOTE RATE [expires=MS]   a RecordRate (default expiry: at + 1,000,000)
Options on any command: id=COMMAND_ID client=CLIENT_ID at=MS (default: 1000 * line number);
on transactions also kind= ref= occurred=MS link=TX rate=SNAPSHOT meta=K:V.
Expected result: "ok" or a rejection code, optionally followed by "dup" (answered from the inbox).
Expected balances: ACCT=POSTED or ACCT=POSTED/HELD, decimal in the account's currency.

After every line the runner checks P1 (each currency sums to zero), the stored records' invariants and that a
duplicate or a rejection changed no account.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streams.core import (
    DEFAULT_CURRENCIES,
    AccountPolicy,
    CloseAccount,
    CurrencyRegistry,
    ExpireHold,
    FreezeAccount,
    Leg,
    MemoryState,
    OpenAccount,
    PlaceHold,
    PostTransaction,
    RecordRate,
    Rejection,
    RegisterCurrency,
    ReleaseHold,
    Result,
    ReverseTransaction,
    UnfreezeAccount,
    check_account,
    check_hold,
    execute,
    parse_amount,
)

_TX_OPTIONS = {"kind", "ref", "occurred", "link", "rate", "meta"}
_COMMON_OPTIONS = {"id", "client", "at", "expires", "overdraft", "max", "route"}


@dataclass
class Ledger:
    """A MemoryState plus the results of every line, for scenario tests."""

    currencies: CurrencyRegistry = DEFAULT_CURRENCIES
    state: MemoryState = field(default_factory=MemoryState)
    results: list[Result] = field(default_factory=list)

    def amount(self, text: str, account_id: str | None = None, currency: str | None = None) -> int:
        code = currency or self.state.accounts[account_id].currency  # type: ignore[index]
        value = parse_amount(text, self.currencies.get(code))  # type: ignore[arg-type]
        assert not isinstance(value, Rejection), f"bad amount {text} for {code}: {value.code}"
        return value

    def run(self, script: str) -> "Ledger":
        for number, raw in enumerate(script.strip().splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            self._line(number, line)
        return self

    def attempt(self, number: int, line: str) -> Result:
        """Run one command line whatever its answer (for generated scenarios, which judge the results
        themselves); the books and records are still checked after it."""
        before = dict(self.state.accounts)
        result, changes = execute(self.state, self._command(number, line), self.currencies)
        self.state.commit(changes)
        self.results.append(result)
        if not result.accepted:
            assert self.state.accounts == before, f"line {number}: a rejection changed accounts"
        self._check_books(number)
        return result

    def _line(self, number: int, line: str) -> None:
        parts = [p.strip() for p in line.split("|")]
        command_text, expected = parts[0], parts[1]
        balances = parts[2] if len(parts) > 2 else ""
        command = self._command(number, command_text)
        before = dict(self.state.accounts)
        result, changes = execute(self.state, command, self.currencies)
        self.state.commit(changes)
        for currency in changes.currencies:  # what the engine does with its partition's registry
            self.currencies = self.currencies.with_currency(currency)
        self.results.append(result)
        got = "ok" if result.accepted else result.reason.code  # type: ignore[union-attr]
        if result.duplicate:
            got += " dup"
        assert got == expected, f"line {number} `{line}`: expected {expected!r}, got {got!r} ({result.detail})"
        if not result.accepted or result.duplicate:
            assert self.state.accounts == before, f"line {number}: a rejection or duplicate changed accounts"
        self._check_books(number)
        for token in balances.split():
            account_id, _, value = token.partition("=")
            account = self.state.accounts[account_id]
            posted_text, _, held_text = value.partition("/")
            assert account.posted == self.amount(posted_text, account_id), (
                f"line {number}: {account_id} posted {account.posted}, expected {posted_text}")
            if held_text:
                assert account.held == self.amount(held_text, account_id), (
                    f"line {number}: {account_id} held {account.held}, expected {held_text}")

    def _check_books(self, number: int) -> None:
        totals: dict[str, int] = {}
        for account in self.state.accounts.values():
            check_account(account)
            totals[account.currency] = totals.get(account.currency, 0) + account.posted
        assert all(total == 0 for total in totals.values()), f"line {number}: books do not balance {totals}"
        held: dict[str, int] = {}
        for hold in self.state.holds.values():
            check_hold(hold)
            held[hold.account_id] = held.get(hold.account_id, 0) + hold.remaining
        for account in self.state.accounts.values():
            assert account.held == held.get(account.id, 0), f"line {number}: {account.id} held != open holds"

    def _command(self, number: int, text: str):
        words = text.split()
        verb, args = words[0], words[1:]
        options: dict[str, list[str]] = {}
        positional: list[str] = []
        for word in args:
            key, sep, value = word.partition("=")
            if sep and key in _TX_OPTIONS | _COMMON_OPTIONS:
                options.setdefault(key, []).append(value)
            else:
                positional.append(word)
        one = {k: v[-1] for k, v in options.items()}
        common = dict(command_id=one.get("id", f"c{number}"), client_id=one.get("client", "test"),
                      at_ms=int(one.get("at", 1000 * number)))
        if verb == "open":
            account_id, currency, *flags = positional
            overdraft = self.amount(one["overdraft"], currency=currency) if "overdraft" in one else 0
            cap = self.amount(one["max"], currency=currency) if "max" in one else None
            policy = AccountPolicy(allow_negative="neg" in flags, overdraft_limit=overdraft, max_balance=cap)
            return OpenAccount(**common, account_id=account_id, currency=currency, policy=policy,
                               routing_key=one.get("route"))
        if verb in ("freeze", "unfreeze", "close"):
            cls = {"freeze": FreezeAccount, "unfreeze": UnfreezeAccount, "close": CloseAccount}[verb]
            return cls(**common, account_id=positional[0])
        if verb == "hold":
            hold_id, account_id, amount = positional
            expires = int(one["expires"]) if "expires" in one else None
            return PlaceHold(**common, hold_id=hold_id, account_id=account_id,
                             amount=self._leg_amount(amount, account_id, None), expires_at_ms=expires)
        if verb == "release":
            return ReleaseHold(**common, hold_id=positional[0])
        if verb == "expire":
            return ExpireHold(**common, hold_id=positional[0])
        if verb == "rate":
            snapshot, base, quote, rate = positional
            expires = int(one["expires"]) if "expires" in one else common["at_ms"] + 1_000_000
            return RecordRate(**common, snapshot_id=snapshot, base=base, quote=quote, rate=rate, expires_at_ms=expires)
        if verb == "register":
            code, scale = positional
            return RegisterCurrency(**common, currency=code, scale=int(scale))
        if verb == "reverse":
            tx_id, original, account_id = positional
            return ReverseTransaction(**common, transaction_id=tx_id, reverses=original, account_id=account_id,
                                      reference=one.get("ref"),
                                      occurred_at_ms=int(one["occurred"]) if "occurred" in one else None)
        if verb in ("transfer", "capture", "tx"):
            tx_id = positional[0]
            if verb == "transfer":
                source, _, target = positional[1].partition("->")
                legs = self._pair(source, target, positional[2], None)
            elif verb == "capture":
                source, _, target = positional[2].partition("->")
                legs = self._pair(source, target, positional[3], positional[1])
            else:
                legs = tuple(self._leg(token) for token in positional[1:])
            metadata = tuple(tuple(m.split(":", 1)) for m in options.get("meta", []))
            return PostTransaction(
                **common, transaction_id=tx_id, legs=legs, kind=one.get("kind", "transfer"),
                reference=one.get("ref"), links=tuple(options.get("link", [])), metadata=metadata,
                occurred_at_ms=int(one["occurred"]) if "occurred" in one else None,
                rate_snapshot_id=one.get("rate"),
            )
        raise ValueError(f"unknown verb {verb}")

    def _leg_amount(self, text: str, account_id: str, currency: str | None) -> int:
        if currency is None and account_id not in self.state.accounts:
            return int(text)  # unknown account: the amount is raw minor units
        return self.amount(text, account_id, currency)

    def _pair(self, source: str, target: str, amount_text: str, hold_id: str | None) -> tuple[Leg, ...]:
        known = source if source in self.state.accounts else target
        amount = self._leg_amount(amount_text, known, None)
        return (Leg(source, -amount, hold_id), Leg(target, amount))

    def _leg(self, token: str) -> Leg:
        left, _, right = token.partition("=")
        account_id, _, hold_id = left.partition("@")
        amount_text, _, currency = right.partition(":")
        amount = self._leg_amount(amount_text, account_id, currency or None)
        return Leg(account_id, amount, hold_id or None, currency or None)


def run(script: str, currencies: CurrencyRegistry = DEFAULT_CURRENCIES) -> Ledger:
    """Run a scenario script and return the ledger for further checks."""
    return Ledger(currencies=currencies).run(script)
