"""Business-event rules: pure, versioned functions from an exchange's or a wallet's events to ledger commands.

A rule takes one business event (a deposit confirmed, an order placed, a trade executed, ...) and returns a
:class:`Plan`: the wire-level command records (the dicts ``schemas/codec.py`` encodes as ``"command"``), each
paired with the account that routes it. Rules do no I/O, read no clock and draw no randomness, so the same
event always gives byte-identical commands; sending them is the caller's job (``LedgerClient.send``, or a
bus in tests), and they go through the same engine as any transaction.

Identity. Every command id is ``<rule>:<business id>`` (``#<attempt>`` appended when ``attempt > 1``) and every
transaction id equals its command id, so an event delivered twice yields the same command and the ledger's
inbox answers the second delivery as a duplicate. The rule version is *not* part of the id: an event replayed
after a rule upgrade hits the same inbox key and, as its payload (metadata) differs, is refused as
``id_conflict`` instead of posting twice. Holds are named ``order:<order id>`` and ``withdrawal:<id>``.

Recording. Every transaction a rule posts carries ``metadata["rule"]`` and ``metadata["rule_version"]`` (plus
the business fields it used). Hold commands (PlaceHold, ReleaseHold) have no metadata field in
``schemas/command.avsc``; their rule is visible in their command id.

Retries (``attempt``). The ledger remembers rejections: a command rejected with ``unknown_hold`` because it
overtook the command placing its hold is answered with the same rejection forever. Once a result is a
definitive rejection, nothing of that attempt can ever post, so the caller may send the event again with
``attempt + 1`` (see :func:`next_attempt`). Never bump the attempt on a timeout (resend the same attempt):
for rules that end a hold (withdrawal completed / failed, order closed) even that would be harmless, as a
hold ends once (P5), but a deposit or a trade would post twice. See docs/rules.md.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, NamedTuple

from streams import routing
from streams.core.fx import fx_account  # the FX desk: the core checks a conversion's amounts there
from streams.core.settlement import CAPTURE_KEY, EXACT, EXTERNAL, PARTIAL, SETTLEMENT_KEY
from streams.core.money import DEFAULT_CURRENCIES, MAX_ABS_AMOUNT, Currency, CurrencyRegistry, parse_amount
from streams.core.rejections import Rejection
from streams.core.returns import RETURNS_KEY
from streams.wire import command_record

Amount = int | str  # int: minor units; str: an exact decimal in major units ("0.5" BTC)
Rounding = Literal["exact", "down", "up"]

DEFAULT_CLIENT_ID = "rules"
# A user's pending account: ``user:<user>:pending.<CUR>`` (like the receivable's ``receivable.<CUR>``).
PENDING_MARK = "pending."
# The metadata keys that record which rule, at which version, posted a transaction (read back by the API).
RULE_KEY, RULE_VERSION_KEY = "rule", "rule_version"
# Rejections that mean "too early, the command it depends on has not been applied yet".
# unknown_rate: a conversion that overtook the recording of its rate snapshot (RecordRate).
ORDERING_REASONS = frozenset({"unknown_hold", "unknown_account", "unknown_rate"})
# Rejections that mean "try again later": the engine remembers every decision, so a later try is the next
# attempt (a new command id), like an ordering rejection.
TRANSIENT_REASONS = frozenset({"in_flight"})


# --- errors -----------------------------------------------------------------------------------------------


class RuleError(ValueError):
    """An event a rule cannot turn into commands. ``code`` is machine-readable, ``field`` names the input."""

    code = "invalid_event"

    def __init__(self, field: str, detail: str):
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


class InvalidEvent(RuleError):
    code = "invalid_event"


class InvalidId(RuleError):
    code = "invalid_id"


class InvalidAmount(RuleError):
    """Zero, negative, malformed or out-of-range amount, price or rate."""

    code = "invalid_amount"


class UnknownCurrency(RuleError):
    code = "unknown_currency"


class PrecisionExceeded(RuleError):
    """A decimal with more digits than the currency's scale."""

    code = "precision_exceeded"


class InexactAmount(RuleError):
    """A product (quantity x price, amount x rate) that is not a whole number of minor units."""

    code = "inexact_amount"


# --- output -----------------------------------------------------------------------------------------------


class Routed(NamedTuple):
    """One command record and the account whose partition it is produced to (unpacks as a pair)."""

    routing_account: str
    record: dict[str, Any]

    @property
    def command_id(self) -> str:
        return self.record["command_id"]


@dataclass(frozen=True, slots=True)
class Plan:
    """What one rule produced for one event: its commands, in the order they must be sent."""

    rule: str
    version: int
    commands: tuple[Routed, ...]

    def __iter__(self) -> Iterator[Routed]:
        return iter(self.commands)

    def __len__(self) -> int:
        return len(self.commands)

    @property
    def command_ids(self) -> list[str]:
        return [c.command_id for c in self.commands]


@dataclass(frozen=True, slots=True)
class Context:
    """What the rules need besides the event: the client id scoping their command ids, the currencies."""

    client_id: str = DEFAULT_CLIENT_ID
    currencies: CurrencyRegistry = DEFAULT_CURRENCIES
    # Default expiry policy: a hold whose event states no expires_at_ms but an occurred_at_ms expires this long
    # after it, so a lost close or failure report cannot strand the reservation. A fill or a completion that
    # arrives after the expiry still posts (a late settlement, docs/rules.md).
    order_ttl_ms: int = 30 * 24 * 3600 * 1000
    withdrawal_ttl_ms: int = 7 * 24 * 3600 * 1000
    # The registered markets (connectors.markets.Market): a pair without one keeps exact arithmetic.
    markets: tuple[Any, ...] = ()


DEFAULT_CONTEXT = Context()


# --- events -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DepositConfirmed:
    deposit_id: str
    user: str
    currency: str
    amount: Amount
    occurred_at_ms: int | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class _DepositInTransit:
    """The fields of a deposit that a payment rail reports before its money arrives (ACH, cards)."""

    deposit_id: str
    user: str
    currency: str
    amount: Amount
    fronted: Amount = 0
    occurred_at_ms: int | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class DepositInitiated(_DepositInTransit):
    """A payment rail reports a deposit on its way to custody (an ACH debit initiated, a card payment
    authorised): owed to the operator, not yet received. The amount waits on the user's pending account,
    except `fronted` of it, which the user may spend at once (an instant deposit): see DepositFronted."""


@dataclass(frozen=True, slots=True)
class DepositFronted:
    """The operator lets the user spend `amount` of an initiated deposit before it settles. The ledger fronts
    only what is receivable: the user's pending account (what the rails still owe for the user's deposits and
    was not fronted yet) may not go below zero, so more than is in transit is refused (insufficient_funds).
    One fronting per deposit: a DepositInitiated with `fronted` is the same command."""

    deposit_id: str
    user: str
    currency: str
    amount: Amount
    occurred_at_ms: int | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class DepositSettled(_DepositInTransit):
    """The initiated deposit's money reached custody: the in-transit claim is cleared, and what was not
    fronted becomes spendable. `fronted` is what the operator fronted of this deposit (0 when none)."""


@dataclass(frozen=True, slots=True)
class DepositFailed(_DepositInTransit):
    """The rail reports that the initiated deposit will not arrive (an ACH return before settlement, a
    declined card payment). The fronted part comes back from the user, as a return of the fronting (what the
    user spent is booked on the user's receivable); the in-transit claim is written off against pending.
    `fronting_attempt` names the fronting's accepted attempt when a first one was refused and sent again."""

    fronting_attempt: int = 1


@dataclass(frozen=True, slots=True)
class WithdrawalRequested:
    withdrawal_id: str
    user: str
    currency: str
    amount: Amount
    fee: Amount = 0
    expires_at_ms: int | None = None
    attempt: int = 1
    occurred_at_ms: int | None = None  # when the user asked; with no expires_at_ms, the expiry policy counts from it


@dataclass(frozen=True, slots=True)
class WithdrawalCompleted:
    withdrawal_id: str
    user: str
    currency: str
    amount: Amount
    fee: Amount = 0
    occurred_at_ms: int | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class WithdrawalFailed:
    withdrawal_id: str
    user: str
    currency: str
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class OrderPlaced:
    """A limit or market order. A limit buy holds qty x limit_price of quote (rounded by its market, if one is
    registered); a market buy (no limit_price) holds its quote ``budget``; a sell holds qty of base."""

    order_id: str
    user: str
    side: Literal["buy", "sell"]
    base: str
    quote: str
    qty: Amount  # base currency
    limit_price: str | int | None = None  # quote per one base unit; required for a buy
    expires_at_ms: int | None = None
    attempt: int = 1
    occurred_at_ms: int | None = None  # when the order was placed; with no expires_at_ms, the expiry policy counts from it
    budget: Amount | None = None  # a market buy: the most quote it may spend (held; the rest returns at the close)


@dataclass(frozen=True, slots=True)
class OrderClosed:
    """Filled, cancelled or expired: whatever is left of the order's hold goes back."""

    order_id: str
    user: str
    side: Literal["buy", "sell"]
    base: str
    quote: str
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class Party:
    """One side of a trade: a user's order (captured from its hold), or the bot (``user=None``: plain legs)."""

    user: str | None
    order_id: str | None = None


BOT = Party(None)  # the exchange's own market-making bot, as a trade side: TradeExecuted(..., seller=BOT)


@dataclass(frozen=True, slots=True)
class TradeExecuted:
    """A fill of qty base at price quote. Fees are rates on what each side receives, rounded as told."""

    trade_id: str
    base: str
    quote: str
    qty: Amount
    price: str | int
    buyer: Party
    seller: Party
    maker: Literal["buyer", "seller"]
    maker_fee_rate: str = "0"
    taker_fee_rate: str = "0"
    fee_rounding: Rounding = "down"
    occurred_at_ms: int | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class FxConverted:
    """A user converts amount of from_currency at rate (to per one from) of a quoted rate snapshot."""

    conversion_id: str
    user: str
    from_currency: str
    to_currency: str
    amount: Amount
    rate: str | int
    rate_snapshot_id: str
    rounding: Rounding = "exact"
    occurred_at_ms: int | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class InternalTransfer:
    transfer_id: str
    from_user: str
    to_user: str
    currency: str
    amount: Amount
    occurred_at_ms: int | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class ReversalRequested:
    """Undo a transaction the same client posted (a deposit credited by mistake, a transfer sent twice).
    `user` and `currency` name the account the original was routed by: the debited user's account, or the
    credited one of a deposit."""

    reversal_id: str
    transaction_id: str  # the transaction to undo, e.g. "deposit_confirmed:chain-tx-9"
    user: str
    currency: str
    occurred_at_ms: int | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class DepositReturned:
    """The bank returns a deposit (kind "return": an ACH return) or the card network charges it back (kind
    "chargeback"), in part or in whole, perhaps after the user spent it: what the user's available cannot
    cover is booked on the user's receivable (streams/core/returns.py). `transaction_id` names the deposit's
    transaction, e.g. "deposit_confirmed:chain-tx-9"; at most what remains unreturned of it goes back."""

    return_id: str
    transaction_id: str
    user: str
    currency: str
    amount: Amount
    kind: Literal["return", "chargeback"] = "return"
    occurred_at_ms: int | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class TransferReturned:
    """A transfer between two users given back, in part or in whole, perhaps after the receiver spent it
    (a refund of a payment to a merchant, say): what the receiver's available cannot cover is booked on its
    receivable. `transaction_id` names the transfer's transaction (e.g. "internal_transfer:t-1"); `from_user`
    and `to_user` are as in that transfer (the money goes back from `to_user` to `from_user`), wherever the
    two live (docs/wallet-operations.md, returns across partitions)."""

    return_id: str
    transaction_id: str
    from_user: str
    to_user: str
    currency: str
    amount: Amount
    kind: Literal["return", "chargeback"] = "return"
    occurred_at_ms: int | None = None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class DepositChargedBack:
    """The card network (or the bank) takes back a deposit in transit after it settled, in part or in whole,
    perhaps after the user spent it: what the user's available cannot cover is booked on the user's
    receivable. The deposit reached the user in steps (initiated, fronted, settled), so the chargeback names
    the settlement and links to the other steps; the ledger nets them into the one payment custody made to the
    user and takes back at most what remains unreturned of it (streams/core/returns.py). `fronted` is what
    was fronted of the deposit (0: none, so there is no fronting step); the `*_attempt` fields name each step's
    accepted attempt when a first one was refused and sent again."""

    deposit_id: str
    user: str
    currency: str
    amount: Amount
    fronted: Amount = 0
    initiation_attempt: int = 1
    fronting_attempt: int = 1
    settlement_attempt: int = 1
    occurred_at_ms: int | None = None
    attempt: int = 1


Event = (DepositConfirmed | WithdrawalRequested | WithdrawalCompleted | WithdrawalFailed | OrderPlaced
         | OrderClosed | TradeExecuted | FxConverted | InternalTransfer | ReversalRequested | DepositReturned
         | DepositInitiated | DepositFronted | DepositSettled | DepositFailed | DepositChargedBack | TransferReturned)


# --- account names ----------------------------------------------------------------------------------------


def user_account(user: str, currency: str) -> str:
    return f"user:{user}:{currency}"


def custody_account(currency: str) -> str:
    return f"sys:custody:{currency}"


def in_transit_account(currency: str) -> str:
    """What the payment rails owe custody for deposits initiated and not settled (an asset)."""
    return f"sys:in_transit:{currency}"


def pending_account(user: str, currency: str) -> str:
    """The user's money in transit that was not fronted: owed to the user once it arrives, not spendable.
    It lives in the user's partition (routing key ``user:<user>``) and may not go negative."""
    return f"user:{user}:{PENDING_MARK}{currency}"


def open_pending_account(user: str, currency: str, ctx: Context) -> Routed:
    """The OpenAccount command of a user's pending account (id ``open:<account>``, like a user account's)."""
    account = pending_account(user, currency)
    body = {"account_id": account, "currency": currency, "allow_negative": False, "overdraft_limit": "0",
            "max_balance": None, "routing_key": None}
    return Routed(account, command_record(ctx.client_id, f"open:{account}", "OpenAccount", body))


def fee_account(currency: str) -> str:
    return f"sys:fees:{currency}"


def rounding_account(currency: str) -> str:
    """What buyers paid above what sellers received on a market's rounded fills (the exchange's)."""
    return f"sys:rounding:{currency}"


def _market(ctx: Context, base: Currency, quote: Currency) -> Any:
    """The pair's registered market (validated against the currencies), or None."""
    for market in ctx.markets:
        if market.base == base.code and market.quote == quote.code:
            market.currencies(ctx.currencies)
            return market
    return None


def liquidity_account(currency: str) -> str:
    return f"sys:liquidity:{currency}"


def order_hold(order_id: str) -> str:
    return f"order:{order_id}"


def withdrawal_hold(withdrawal_id: str) -> str:
    return f"withdrawal:{withdrawal_id}"


def open_user_account(user: str, currency: str, ctx: Context = DEFAULT_CONTEXT) -> Routed:
    """The OpenAccount command of a user's account (id ``open:<account>``); not a versioned rule."""
    _user(user, "user")
    _currency(currency, ctx, "currency")
    account = user_account(user, currency)
    body = {"account_id": account, "currency": currency, "allow_negative": False, "overdraft_limit": "0",
            "max_balance": None, "routing_key": None}
    return Routed(account, command_record(ctx.client_id, f"open:{account}", "OpenAccount", body))


# --- validation and exact arithmetic ----------------------------------------------------------------------

_ID = re.compile(r"[A-Za-z0-9._:/-]{1,128}\Z")
_USER = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
_DECIMAL = re.compile(r"([0-9]+)(?:\.([0-9]+))?\Z")


def _business_id(value: Any, field: str) -> str:
    if type(value) is not str or not _ID.match(value):
        raise InvalidId(field, f"must be 1-128 characters of A-Z a-z 0-9 . _ : / -, got {value!r}")
    return value


def _user(value: Any, field: str) -> str:
    if type(value) is not str or not _USER.match(value):
        raise InvalidId(field, f"must be 1-64 characters of A-Z a-z 0-9 . _ -, got {value!r}")
    return value


def _currency(code: Any, ctx: Context, field: str) -> Currency:
    currency = ctx.currencies.get(code) if type(code) is str else None
    if currency is None:
        raise UnknownCurrency(field, f"currency {code!r} is not registered")
    return currency


def _attempt(value: Any, field: str = "attempt") -> int:
    if type(value) is not int or value < 1:
        raise InvalidEvent(field, f"must be an integer >= 1, got {value!r}")
    return value


def _expiry(expires_at_ms: Any, occurred_at_ms: Any, ttl_ms: int) -> int | None:
    """The hold's expiry: as the event states it, else the context's policy counted from the event's time."""
    expires, occurred = _time(expires_at_ms, "expires_at_ms"), _time(occurred_at_ms, "occurred_at_ms")
    if expires is None and occurred is not None:
        return occurred + ttl_ms
    return expires


def _settling(**fields: str) -> dict[str, str]:
    """Metadata of a transaction that records a settlement the outside world already made (see
    streams/core/settlement.py): never refused because its hold expired or was released first."""
    return {SETTLEMENT_KEY: EXTERNAL, **fields}


def _time(value: Any, field: str) -> int | None:
    if value is not None and (type(value) is not int or value < 0):
        raise InvalidEvent(field, f"must be None or a non-negative integer of ms, got {value!r}")
    return value


def to_minor(value: Any, currency: Currency, field: str, *, allow_zero: bool = False) -> int:
    """An int (minor units) or an exact decimal string (major units) -> positive minor units."""
    if type(value) is int:
        minor = value
    elif type(value) is str:
        parsed = parse_amount(value, currency)
        if parsed is Rejection.PRECISION_EXCEEDED:
            raise PrecisionExceeded(field, f"{value!r} has more decimals than {currency.code}'s {currency.scale}")
        if isinstance(parsed, Rejection):
            raise InvalidAmount(field, f"{value!r} is not an exact decimal amount ({parsed.code})")
        minor = parsed
    else:
        raise InvalidAmount(field, f"must be an int of minor units or a decimal string, got {type(value).__name__}")
    if minor < 0 or (minor == 0 and not allow_zero):
        raise InvalidAmount(field, f"must be {'non-negative' if allow_zero else 'positive'}, got {value!r}")
    if minor > MAX_ABS_AMOUNT:
        raise InvalidAmount(field, "beyond the signed 128-bit range")
    return minor


def ratio(value: Any, field: str, *, allow_zero: bool = False) -> tuple[int, int]:
    """A non-negative decimal string or int -> (numerator, denominator) exactly: "59900.5" -> (599005, 10)."""
    if type(value) is int:
        num, den = value, 1
    elif type(value) is str and (m := _DECIMAL.match(value)):
        whole, fraction = m.group(1), m.group(2) or ""
        num, den = int(whole + fraction), 10 ** len(fraction)
    else:
        raise InvalidAmount(field, f"must be a decimal string like '59900.5' or an int, got {value!r}")
    if num < 0 or (num == 0 and not allow_zero):
        raise InvalidAmount(field, f"must be {'non-negative' if allow_zero else 'positive'}, got {value!r}")
    return num, den


def _divide(num: int, den: int, rounding: Rounding, field: str) -> int:
    q, r = divmod(num, den)
    if r:
        if rounding == "exact":
            raise InexactAmount(field, f"{num}/{den} is not a whole number of minor units")
        if rounding == "up":
            q += 1
    if q > MAX_ABS_AMOUNT:
        raise InvalidAmount(field, "beyond the signed 128-bit range")
    return q


def convert(amount_minor: int, source: Currency, target: Currency, rate: tuple[int, int],
            rounding: Rounding, field: str) -> int:
    """amount (minor units of source) x rate (target per one source unit) in minor units of target."""
    num, den = rate
    return _divide(amount_minor * num * 10**target.scale, den * 10**source.scale, rounding, field)


def fee_of(amount_minor: int, rate: tuple[int, int], rounding: Rounding, field: str) -> int:
    num, den = rate
    return _divide(amount_minor * num, den, rounding, field)


def _rounding(value: Any, field: str) -> Rounding:
    if value not in ("exact", "down", "up"):
        raise InvalidEvent(field, f"must be 'exact', 'down' or 'up', got {value!r}")
    return value


# --- command records --------------------------------------------------------------------------------------


def _command_id(rule: str, business_id: str, attempt: int) -> str:
    return f"{rule}:{business_id}" + (f"#{attempt}" if attempt > 1 else "")


def _leg(account: str, amount: int, currency: str, hold_id: str | None = None) -> dict[str, Any]:
    return {"account_id": account, "amount": str(amount), "hold_id": hold_id, "currency": currency}


def _transaction(ctx: Context, command_id: str, legs: list[dict[str, Any]], *, kind: str, reference: str,
                 metadata: dict[str, str], occurred_at_ms: int | None = None,
                 rate_snapshot_id: str | None = None, links: tuple[str, ...] = (),
                 route_by: str | None = None) -> Routed:
    legs = [leg for leg in legs if leg["amount"] != "0"]  # a fee of 0 is no leg (zero legs are invalid)
    body = {"transaction_id": command_id, "legs": legs, "kind": kind, "reference": reference, "links": list(links),
            "metadata": dict(sorted(metadata.items())), "occurred_at_ms": occurred_at_ms,
            "rate_snapshot_id": rate_snapshot_id}
    debits = [leg["account_id"] for leg in legs if leg["amount"].startswith("-")]
    ordinary = [a for a in debits if not routing.is_system(a)]
    routing_account = route_by or (ordinary or [leg["account_id"] for leg in legs
                                                 if not routing.is_system(leg["account_id"])] or debits)[0]
    return Routed(routing_account, command_record(ctx.client_id, command_id, "PostTransaction", body))


def _place_hold(ctx: Context, command_id: str, hold_id: str, account: str, amount: int,
                expires_at_ms: int | None) -> Routed:
    body = {"hold_id": hold_id, "account_id": account, "amount": str(amount), "expires_at_ms": expires_at_ms}
    return Routed(account, command_record(ctx.client_id, command_id, "PlaceHold", body))


def _release_hold(ctx: Context, command_id: str, hold_id: str, account: str) -> Routed:
    return Routed(account, command_record(ctx.client_id, command_id, "ReleaseHold", {"hold_id": hold_id}))


# --- the rules --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RuleSpec:
    name: str
    version: int
    event: type
    build: Callable[[Any, Context, "RuleSpec"], tuple[Routed, ...]]

    def meta(self, attempt: int, **fields: str) -> dict[str, str]:
        meta = {RULE_KEY: self.name, RULE_VERSION_KEY: str(self.version), **fields}
        if attempt > 1:
            meta["attempt"] = str(attempt)
        return meta


RULES: dict[type, RuleSpec] = {}


def rule(name: str, version: int, event: type):
    def register(build):
        RULES[event] = RuleSpec(name, version, event, build)
        return build
    return register


@rule("deposit_confirmed", 1, DepositConfirmed)
def _deposit(e: DepositConfirmed, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """Custody receives the money, the user's account is credited."""
    dep = _business_id(e.deposit_id, "deposit_id")
    user = _user(e.user, "user")
    cur = _currency(e.currency, ctx, "currency")
    amount = to_minor(e.amount, cur, "amount")
    cid = _command_id(spec.name, dep, _attempt(e.attempt))
    return (_transaction(ctx, cid, [_leg(custody_account(cur.code), -amount, cur.code),
                                    _leg(user_account(user, cur.code), amount, cur.code)],
                         kind="deposit", reference=dep, occurred_at_ms=_time(e.occurred_at_ms, "occurred_at_ms"),
                         metadata=spec.meta(e.attempt, deposit_id=dep)),)


@rule("withdrawal_requested", 1, WithdrawalRequested)
def _withdrawal_requested(e: WithdrawalRequested, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """Hold amount + fee on the user's account until the withdrawal completes or fails."""
    wid = _business_id(e.withdrawal_id, "withdrawal_id")
    user = _user(e.user, "user")
    cur = _currency(e.currency, ctx, "currency")
    total = to_minor(e.amount, cur, "amount") + to_minor(e.fee, cur, "fee", allow_zero=True)
    cid = _command_id(spec.name, wid, _attempt(e.attempt))
    return (_place_hold(ctx, cid, withdrawal_hold(wid), user_account(user, cur.code), total,
                        _expiry(e.expires_at_ms, e.occurred_at_ms, ctx.withdrawal_ttl_ms)),)


@rule("withdrawal_completed", 2, WithdrawalCompleted)
def _withdrawal_completed(e: WithdrawalCompleted, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """Capture the whole hold, exactly: amount back to custody (it left the wallet), fee to the fee account.
    v2: the custody paid out already, so it settles even after the hold expired or was released (late)."""
    wid = _business_id(e.withdrawal_id, "withdrawal_id")
    user = _user(e.user, "user")
    cur = _currency(e.currency, ctx, "currency")
    amount = to_minor(e.amount, cur, "amount")
    fee = to_minor(e.fee, cur, "fee", allow_zero=True)
    cid = _command_id(spec.name, wid, _attempt(e.attempt))
    legs = [_leg(user_account(user, cur.code), -(amount + fee), cur.code, withdrawal_hold(wid)),
            _leg(custody_account(cur.code), amount, cur.code),
            _leg(fee_account(cur.code), fee, cur.code)]
    return (_transaction(ctx, cid, legs, kind="withdrawal", reference=wid,
                         occurred_at_ms=_time(e.occurred_at_ms, "occurred_at_ms"),
                         metadata=spec.meta(e.attempt, withdrawal_id=wid,
                                            **_settling(**{CAPTURE_KEY: EXACT}))),)


@rule("withdrawal_failed", 1, WithdrawalFailed)
def _withdrawal_failed(e: WithdrawalFailed, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """Release the hold: the user gets amount + fee back."""
    wid = _business_id(e.withdrawal_id, "withdrawal_id")
    user = _user(e.user, "user")
    cur = _currency(e.currency, ctx, "currency")
    cid = _command_id(spec.name, wid, _attempt(e.attempt))
    return (_release_hold(ctx, cid, withdrawal_hold(wid), user_account(user, cur.code)),)


def _side(value: Any) -> str:
    if value not in ("buy", "sell"):
        raise InvalidEvent("side", f"must be 'buy' or 'sell', got {value!r}")
    return value


def _pair(base: Any, quote: Any, ctx: Context) -> tuple[Currency, Currency]:
    b, q = _currency(base, ctx, "base"), _currency(quote, ctx, "quote")
    if b.code == q.code:
        raise InvalidEvent("quote", "base and quote must differ")
    return b, q


@rule("order_placed", 2, OrderPlaced)
def _order_placed(e: OrderPlaced, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """Hold what the order may spend: for a limit buy qty x limit price of quote (exact, or as its market
    rounds it, plus the market's margin), for a market buy its budget, for a sell qty of base.
    v2: markets (lot, tick, rounding) and market buys."""
    oid = _business_id(e.order_id, "order_id")
    user = _user(e.user, "user")
    side = _side(e.side)
    base, quote = _pair(e.base, e.quote, ctx)
    qty = to_minor(e.qty, base, "qty")
    market = _market(ctx, base, quote)
    if market is not None:
        market.lots(qty, base)
    if side == "buy" and e.limit_price is None:
        if e.budget is None:
            raise InvalidEvent("limit_price", "a buy needs a limit price or, as a market order, a budget")
        amount, account = to_minor(e.budget, quote, "budget"), user_account(user, quote.code)
    elif e.budget is not None:
        raise InvalidEvent("budget", "only a market buy (no limit price) holds a budget")
    elif side == "buy":
        if market is not None:
            amount = market.reservation(qty, e.limit_price, base, quote)
        else:
            amount = convert(qty, base, quote, ratio(e.limit_price, "limit_price"), "exact", "limit_price")
        if amount == 0:
            raise InvalidAmount("limit_price", "qty x limit price is zero")
        account = user_account(user, quote.code)
    else:
        if e.limit_price is not None:  # validated, not needed: a sell holds its base quantity
            market.price(e.limit_price, "limit_price") if market is not None else ratio(e.limit_price, "limit_price")
        amount, account = qty, user_account(user, base.code)
    cid = _command_id(spec.name, oid, _attempt(e.attempt))
    return (_place_hold(ctx, cid, order_hold(oid), account, amount,
                        _expiry(e.expires_at_ms, e.occurred_at_ms, ctx.order_ttl_ms)),)


@rule("order_closed", 1, OrderClosed)
def _order_closed(e: OrderClosed, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """Release what is left of the order's hold (a buy filled below its limit gets the difference back)."""
    oid = _business_id(e.order_id, "order_id")
    user = _user(e.user, "user")
    side = _side(e.side)
    base, quote = _pair(e.base, e.quote, ctx)
    account = user_account(user, (quote if side == "buy" else base).code)
    cid = _command_id(spec.name, oid, _attempt(e.attempt))
    return (_release_hold(ctx, cid, order_hold(oid), account),)


def _party(p: Any, field: str) -> Party:
    if not isinstance(p, Party):
        raise InvalidEvent(field, f"must be a Party, got {type(p).__name__}")
    if p.user is None:
        if p.order_id is not None:
            raise InvalidEvent(field, "the bot trades from its liquidity accounts, without an order hold")
        return p
    _user(p.user, f"{field}.user")
    _business_id(p.order_id, f"{field}.order_id")
    return p


@rule("trade_executed", 2, TradeExecuted)
def _trade(e: TradeExecuted, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """One transaction for the fill: both sides pay from their order holds and receive minus their fee.

    The buyer pays qty x price of quote (exact) and receives qty of base minus its fee; the seller delivers
    qty of base and receives the quote minus its fee; fees go to ``sys:fees:<CUR>``. The bot's side uses
    ``sys:liquidity:<CUR>`` with plain legs and pays no fee. v2: the fill was matched already, so it settles
    even after an order's hold expired or was released (a late settlement); captures are partial.
    """
    tid = _business_id(e.trade_id, "trade_id")
    base, quote = _pair(e.base, e.quote, ctx)
    buyer, seller = _party(e.buyer, "buyer"), _party(e.seller, "seller")
    if buyer.user is None and seller.user is None:
        raise InvalidEvent("seller", "the bot cannot trade with itself")
    if e.maker not in ("buyer", "seller"):
        raise InvalidEvent("maker", f"must be 'buyer' or 'seller', got {e.maker!r}")
    rounding = _rounding(e.fee_rounding, "fee_rounding")
    qty = to_minor(e.qty, base, "qty")
    market = _market(ctx, base, quote)
    if market is not None:  # each side's amount rounded its own way, the difference to sys:rounding:<quote>
        fill = market.fill(qty, e.price, base, quote)
        pays, notional, dust = fill.buyer_pays, fill.seller_gets, fill.dust
    else:
        notional = convert(qty, base, quote, ratio(e.price, "price"), "exact", "price")
        pays, dust = notional, 0
    if notional == 0:
        raise InvalidAmount("price", "qty x price is zero")
    maker_rate = ratio(e.maker_fee_rate, "maker_fee_rate", allow_zero=True)
    taker_rate = ratio(e.taker_fee_rate, "taker_fee_rate", allow_zero=True)
    buyer_rate, seller_rate = (maker_rate, taker_rate) if e.maker == "buyer" else (taker_rate, maker_rate)
    # With a market, each side's fee is rounded as the market says; else as the event says, for both.
    buyer_rounding, seller_rounding = (rounding, rounding) if market is None else \
        (market.buyer_fee_rounding, market.seller_fee_rounding)
    buyer_fee = 0 if buyer.user is None else fee_of(qty, buyer_rate, buyer_rounding, "buyer fee")
    seller_fee = 0 if seller.user is None else fee_of(notional, seller_rate, seller_rounding, "seller fee")
    if buyer_fee > qty or seller_fee > notional:
        raise InvalidAmount("fee_rate", "a fee larger than what the side receives")

    def acct(party: Party, cur: Currency) -> str:
        return liquidity_account(cur.code) if party.user is None else user_account(party.user, cur.code)

    def hold(party: Party) -> str | None:
        return None if party.user is None else order_hold(party.order_id)

    q, b = quote.code, base.code
    legs = [_leg(acct(buyer, quote), -pays, q, hold(buyer)),
            _leg(acct(seller, quote), notional - seller_fee, q),
            _leg(fee_account(q), seller_fee, q),
            _leg(rounding_account(q), dust, q),
            _leg(acct(seller, base), -qty, b, hold(seller)),
            _leg(acct(buyer, base), qty - buyer_fee, b),
            _leg(fee_account(b), buyer_fee, b)]
    meta = spec.meta(e.attempt, trade_id=tid, qty=str(qty), price=e.price if type(e.price) is str else str(e.price),
                     maker=e.maker, buyer_order=buyer.order_id or "bot", seller_order=seller.order_id or "bot",
                     buyer_fee=str(buyer_fee), seller_fee=str(seller_fee), fee_rounding=rounding,
                     **_settling(**{CAPTURE_KEY: PARTIAL}))
    if market is not None:  # how this fill was rounded, on the transaction itself
        meta.update(market=market.symbol, notional=f"{fill.notional[0]}/{fill.notional[1]}",
                    buyer_pays=str(pays), seller_gets=str(notional), rounding_dust=str(dust),
                    pay_rounding=market.pay_rounding, receive_rounding=market.receive_rounding,
                    fee_rounding=f"buyer:{buyer_rounding},seller:{seller_rounding}")
    cid = _command_id(spec.name, tid, _attempt(e.attempt))
    return (_transaction(ctx, cid, legs, kind="trade", reference=tid, metadata=meta,
                         occurred_at_ms=_time(e.occurred_at_ms, "occurred_at_ms")),)


@rule("fx_converted", 1, FxConverted)
def _fx(e: FxConverted, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """One transaction in two currencies: the user's source money to sys:fx:<FROM>, sys:fx:<TO> pays out."""
    xid = _business_id(e.conversion_id, "conversion_id")
    snapshot = _business_id(e.rate_snapshot_id, "rate_snapshot_id")
    user = _user(e.user, "user")
    src, dst = _currency(e.from_currency, ctx, "from_currency"), _currency(e.to_currency, ctx, "to_currency")
    if src.code == dst.code:
        raise InvalidEvent("to_currency", "a conversion needs two currencies")
    amount = to_minor(e.amount, src, "amount")
    out = convert(amount, src, dst, ratio(e.rate, "rate"), _rounding(e.rounding, "rounding"), "rate")
    if out == 0:
        raise InvalidAmount("rate", "the converted amount is zero")
    legs = [_leg(user_account(user, src.code), -amount, src.code),
            _leg(fx_account(src.code), amount, src.code),
            _leg(fx_account(dst.code), -out, dst.code),
            _leg(user_account(user, dst.code), out, dst.code)]
    meta = spec.meta(e.attempt, conversion_id=xid, rate=str(e.rate), rounding=e.rounding)
    cid = _command_id(spec.name, xid, _attempt(e.attempt))
    return (_transaction(ctx, cid, legs, kind="fx", reference=xid, metadata=meta, rate_snapshot_id=snapshot,
                         occurred_at_ms=_time(e.occurred_at_ms, "occurred_at_ms")),)


@rule("internal_transfer", 1, InternalTransfer)
def _transfer(e: InternalTransfer, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    tid = _business_id(e.transfer_id, "transfer_id")
    src, dst = _user(e.from_user, "from_user"), _user(e.to_user, "to_user")
    if src == dst:
        raise InvalidEvent("to_user", "a transfer needs two users")
    cur = _currency(e.currency, ctx, "currency")
    amount = to_minor(e.amount, cur, "amount")
    cid = _command_id(spec.name, tid, _attempt(e.attempt))
    return (_transaction(ctx, cid, [_leg(user_account(src, cur.code), -amount, cur.code),
                                    _leg(user_account(dst, cur.code), amount, cur.code)],
                         kind="transfer", reference=tid, metadata=spec.meta(e.attempt, transfer_id=tid),
                         occurred_at_ms=_time(e.occurred_at_ms, "occurred_at_ms")),)


@rule("reversal_requested", 1, ReversalRequested)
def _reversal(e: ReversalRequested, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """A ReverseTransaction: the ledger mirrors the original's legs once, if this client posted it. Like a
    hold command it has no metadata field: the rule is visible in its id (``reversal_requested:<id>``)."""
    rid = _business_id(e.reversal_id, "reversal_id")
    original = _business_id(e.transaction_id, "transaction_id")
    user = _user(e.user, "user")
    cur = _currency(e.currency, ctx, "currency")
    cid = _command_id(spec.name, rid, _attempt(e.attempt))
    body = {"transaction_id": cid, "reverses": original, "account_id": user_account(user, cur.code),
            "reference": rid, "occurred_at_ms": _time(e.occurred_at_ms, "occurred_at_ms")}
    return (Routed(body["account_id"], command_record(ctx.client_id, cid, "ReverseTransaction", body)),)


@rule("deposit_returned", 1, DepositReturned)
def _deposit_returned(e: DepositReturned, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """The deposit's money back from the user to custody, as a return of the deposit's transaction (the
    ledger.returns key): the ledger refuses more than remains unreturned, another client's deposit, and
    anything but a two-leg payment (exceeds_unreturned, client_mismatch, not_returnable)."""
    rid = _business_id(e.return_id, "return_id")
    deposit = _business_id(e.transaction_id, "transaction_id")
    user = _user(e.user, "user")
    cur = _currency(e.currency, ctx, "currency")
    amount = to_minor(e.amount, cur, "amount")
    if e.kind not in ("return", "chargeback"):
        raise InvalidEvent("kind", f"must be return or chargeback, got {e.kind!r}")
    cid = _command_id(spec.name, rid, _attempt(e.attempt))
    return (_transaction(ctx, cid, [_leg(user_account(user, cur.code), -amount, cur.code),
                                    _leg(custody_account(cur.code), amount, cur.code)],
                         kind=e.kind, reference=rid, occurred_at_ms=_time(e.occurred_at_ms, "occurred_at_ms"),
                         metadata={**spec.meta(e.attempt, return_id=rid), RETURNS_KEY: deposit},
                         links=(deposit,)),)


@rule("transfer_returned", 1, TransferReturned)
def _transfer_returned(e: TransferReturned, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """The transfer's money back from its receiver to its sender, as a return of the transfer's transaction
    (the ledger.returns key), judged by the ledger like any return: at most what remains unreturned, only
    the client's own transfer, the two users the transfer moved money between."""
    rid = _business_id(e.return_id, "return_id")
    transfer = _business_id(e.transaction_id, "transaction_id")
    src, dst = _user(e.from_user, "from_user"), _user(e.to_user, "to_user")
    if src == dst:
        raise InvalidEvent("to_user", "a transfer is between two users")
    cur = _currency(e.currency, ctx, "currency")
    amount = to_minor(e.amount, cur, "amount")
    if e.kind not in ("return", "chargeback"):
        raise InvalidEvent("kind", f"must be return or chargeback, got {e.kind!r}")
    cid = _command_id(spec.name, rid, _attempt(e.attempt))
    return (_transaction(ctx, cid, [_leg(user_account(dst, cur.code), -amount, cur.code),
                                    _leg(user_account(src, cur.code), amount, cur.code)],
                         kind=e.kind, reference=rid, occurred_at_ms=_time(e.occurred_at_ms, "occurred_at_ms"),
                         metadata={**spec.meta(e.attempt, return_id=rid), RETURNS_KEY: transfer},
                         links=(transfer,)),)


# --- deposits in transit: fronting only what is receivable ------------------------------------------------


def _in_transit(e: Any, ctx: Context) -> tuple[str, str, Currency, int, int]:
    """The fields every in-transit deposit event has: deposit id, user, currency, amount, fronted."""
    dep = _business_id(e.deposit_id, "deposit_id")
    user = _user(e.user, "user")
    cur = _currency(e.currency, ctx, "currency")
    amount = to_minor(e.amount, cur, "amount")
    fronted = to_minor(getattr(e, "fronted", 0), cur, "fronted", allow_zero=True)
    if fronted > amount:
        raise InvalidAmount("fronted", f"more than the deposit's amount {e.amount!r}: only what is receivable "
                                       "may be fronted")
    return dep, user, cur, amount, fronted


def _fronting(ctx: Context, dep: str, user: str, cur: Currency, amount: int, attempt: int,
              occurred_at_ms: int | None) -> Routed:
    """The fronting of a deposit (``deposit_fronted:<deposit>``): from the user's pending account to the
    user's account. The same command whichever event asks for it, so a deposit is fronted once."""
    spec = RULES[DepositFronted]
    return _transaction(ctx, _command_id(spec.name, dep, attempt),
                        [_leg(pending_account(user, cur.code), -amount, cur.code),
                         _leg(user_account(user, cur.code), amount, cur.code)],
                        kind="deposit_fronted", reference=dep, occurred_at_ms=occurred_at_ms,
                        metadata=spec.meta(attempt, deposit_id=dep))


@rule("deposit_initiated", 1, DepositInitiated)
def _deposit_initiated(e: DepositInitiated, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """The rail owes the deposit (sys:in_transit), the user is owed it once it arrives (pending); the
    fronted part, if any, moves on to the user's account in a second command."""
    dep, user, cur, amount, fronted = _in_transit(e, ctx)
    attempt, at = _attempt(e.attempt), _time(e.occurred_at_ms, "occurred_at_ms")
    initiated = _transaction(ctx, _command_id(spec.name, dep, attempt),
                             [_leg(in_transit_account(cur.code), -amount, cur.code),
                              _leg(pending_account(user, cur.code), amount, cur.code)],
                             kind="deposit_initiated", reference=dep, occurred_at_ms=at,
                             metadata=spec.meta(attempt, deposit_id=dep))
    front = (_fronting(ctx, dep, user, cur, fronted, attempt, at),) if fronted else ()
    return (open_pending_account(user, cur.code, ctx), initiated, *front)


@rule("deposit_fronted", 1, DepositFronted)
def _deposit_fronted(e: DepositFronted, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """Front part of an initiated deposit; the ledger refuses more than the user's pending account holds."""
    dep, user, cur, amount, _ = _in_transit(e, ctx)
    return (_fronting(ctx, dep, user, cur, amount, _attempt(e.attempt), _time(e.occurred_at_ms, "occurred_at_ms")),)


@rule("deposit_settled", 1, DepositSettled)
def _deposit_settled(e: DepositSettled, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """Custody receives the money the rail owed; what was not fronted leaves pending for the user's account."""
    dep, user, cur, amount, fronted = _in_transit(e, ctx)
    attempt = _attempt(e.attempt)
    legs = [_leg(custody_account(cur.code), -amount, cur.code),
            _leg(in_transit_account(cur.code), amount, cur.code),
            _leg(pending_account(user, cur.code), -(amount - fronted), cur.code),
            _leg(user_account(user, cur.code), amount - fronted, cur.code)]
    return (_transaction(ctx, _command_id(spec.name, dep, attempt), legs, kind="deposit", reference=dep,
                         occurred_at_ms=_time(e.occurred_at_ms, "occurred_at_ms"),
                         metadata=spec.meta(attempt, deposit_id=dep, fronted=str(fronted)),
                         links=(_command_id(RULES[DepositInitiated].name, dep, 1),),
                         route_by=pending_account(user, cur.code)),)


@rule("deposit_failed", 1, DepositFailed)
def _deposit_failed(e: DepositFailed, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """The fronted money comes back to pending as a return of the fronting (the core books on the user's
    receivable what the user spent), then pending gives the whole amount back against the rail's claim."""
    dep, user, cur, amount, fronted = _in_transit(e, ctx)
    attempt, at = _attempt(e.attempt), _time(e.occurred_at_ms, "occurred_at_ms")
    cid = _command_id(spec.name, dep, attempt)
    fronting = _command_id(RULES[DepositFronted].name, dep, _attempt(e.fronting_attempt))
    clawback = (_transaction(ctx, f"{cid}:return", [_leg(user_account(user, cur.code), -fronted, cur.code),
                                                   _leg(pending_account(user, cur.code), fronted, cur.code)],
                             kind="return", reference=dep, occurred_at_ms=at,
                             metadata={**spec.meta(attempt, deposit_id=dep), RETURNS_KEY: fronting},
                             links=(fronting,)),) if fronted else ()
    written_off = _transaction(ctx, cid, [_leg(pending_account(user, cur.code), -amount, cur.code),
                                          _leg(in_transit_account(cur.code), amount, cur.code)],
                               kind="deposit_failed", reference=dep, occurred_at_ms=at,
                               metadata=spec.meta(attempt, deposit_id=dep, fronted=str(fronted)),
                               links=(_command_id(RULES[DepositInitiated].name, dep, 1),))
    return (*clawback, written_off)


@rule("deposit_charged_back", 1, DepositChargedBack)
def _deposit_charged_back(e: DepositChargedBack, ctx: Context, spec: RuleSpec) -> tuple[Routed, ...]:
    """The settled deposit's money back from the user to custody, as a return of the payment its steps make
    together: ``ledger.returns`` names the settlement, the links name it and the initiation and fronting. One
    chargeback per deposit (the id is the deposit's); the ledger refuses more than remains unreturned."""
    dep = _business_id(e.deposit_id, "deposit_id")
    user = _user(e.user, "user")
    cur = _currency(e.currency, ctx, "currency")
    amount = to_minor(e.amount, cur, "amount")
    fronted = to_minor(e.fronted, cur, "fronted", allow_zero=True)
    attempt = _attempt(e.attempt)
    settled = _command_id(RULES[DepositSettled].name, dep, _attempt(e.settlement_attempt, "settlement_attempt"))
    initiated = _command_id(RULES[DepositInitiated].name, dep, _attempt(e.initiation_attempt, "initiation_attempt"))
    fronting = _command_id(RULES[DepositFronted].name, dep, _attempt(e.fronting_attempt, "fronting_attempt"))
    return (_transaction(ctx, _command_id(spec.name, dep, attempt),
                         [_leg(user_account(user, cur.code), -amount, cur.code),
                          _leg(custody_account(cur.code), amount, cur.code)],
                         kind="chargeback", reference=dep, occurred_at_ms=_time(e.occurred_at_ms, "occurred_at_ms"),
                         metadata={**spec.meta(attempt, deposit_id=dep, fronted=str(fronted)), RETURNS_KEY: settled},
                         links=(settled, initiated, *((fronting,) if fronted else ()))),)


RULE_VERSIONS: dict[str, int] = {spec.name: spec.version for spec in RULES.values()}


def plan(event: Event, ctx: Context = DEFAULT_CONTEXT) -> Plan:
    """The commands for one business event. Raises a RuleError for an event the rule cannot accept."""
    spec = RULES.get(type(event))
    if spec is None:
        raise TypeError(f"no rule for {type(event).__name__}")
    return Plan(spec.name, spec.version, spec.build(event, ctx, spec))


def next_attempt(event: Event, result: dict[str, Any]) -> Event | None:
    """What to send after a definitive result: the same event (transient), the next attempt, or nothing.

    ``result`` is a decoded Result record. Accepted, duplicate of an acceptance, or a business rejection
    (insufficient funds, hold not open, ...): None. ``in_flight`` (too many transactions in flight on the
    accounts) and ``unknown_hold`` / ``unknown_account`` (the command overtook the one it depends on): the
    next attempt (attempt + 1), since the engine remembers the rejection of this one.
    """
    reason = result.get("reason")
    if result.get("outcome") != "rejected" or reason is None:
        return None
    if reason in TRANSIENT_REASONS or reason in ORDERING_REASONS:
        return dataclasses.replace(event, attempt=event.attempt + 1)
    return None
