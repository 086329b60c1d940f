"""`ledger import`: history from another system, with its original timestamps, checked before it posts.

An import file is the JSON Lines of `ledger submit` (connectors/jsonl.py) where every line also carries
`at_ms`: when it originally happened (ms since the epoch). Each command is produced with that time as its
Kafka record timestamp, which is the command's log time (`at_ms`) in the ledger: account opens, holds and
every other change keep their original times, and a transaction's business time (`occurred_at_ms`) is its
`at_ms` unless the line says otherwise. Lines must be in time order (the ledger decides a partition's
commands in log order, and hold expiry follows log time). The topics keep records forever
(`retention.ms=-1`, connectors/admin.py), so old timestamps are safe.

The staged check (`check`) runs the whole file through the pure core, in order, against an empty ledger in
which system accounts open themselves as the engine's do: it predicts each line's decision before anything
is sent. An import is for accounts the ledger does not hold yet (a backfill); a line naming an account the
file does not open is predicted `unknown_account`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from connectors.client import LedgerClient
from connectors.jsonl import LineError, parse_line
from streams import core, routing
from streams.wire import WireError, command_from_wire, command_record


class _Recorder:
    """LedgerClient's command builders without Kafka: keeps the records they would send."""

    open_account = LedgerClient.open_account
    post = LedgerClient.post
    place_hold = LedgerClient.place_hold
    release_hold = LedgerClient.release_hold
    account_command = LedgerClient.account_command
    reverse = LedgerClient.reverse
    return_payment = LedgerClient.return_payment

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, command_id: str, body_name: str, body: dict[str, Any], routing_account: str) -> str:
        self.sent.append((routing_account, command_record(self.client_id, command_id, body_name, body)))
        return command_id


@dataclass(frozen=True, slots=True)
class ImportLine:
    number: int  # line number in the file
    at_ms: int  # its original time: the record timestamp it is produced with
    routing_account: str
    record: dict[str, Any]  # the wire Command

    @property
    def command_id(self) -> str:
        return self.record["command_id"]


@dataclass(frozen=True, slots=True)
class Prediction:
    number: int
    command_id: str
    outcome: str  # "accepted" or the rejection code


def parse_import(lines: list[str], client_id: str, currencies: core.CurrencyRegistry = core.DEFAULT_CURRENCIES,
                 ) -> tuple[list[ImportLine], list[tuple[int, str]]]:
    """Every good line as a dated command, every bad one with its error. A post's business time defaults to
    its at_ms. Lines out of time order are errors. currencies: what amounts are parsed against."""
    good, bad = [], []
    last = None
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
            at_ms = obj.get("at_ms") if isinstance(obj, dict) else None
            if type(at_ms) is not int or not 0 <= at_ms < 2**63:
                raise LineError("'at_ms' (the original time, ms since the epoch) is required on every line")
            if last is not None and at_ms < last:
                raise LineError(f"at_ms {at_ms} is before the previous line's {last}: an import is in time order")
            if obj.get("type") == "post" and "occurred_at_ms" not in obj:
                text = json.dumps({**obj, "occurred_at_ms": at_ms})
            recorder = _Recorder(client_id)
            parse_line(number, text, currencies).send(recorder)
        except json.JSONDecodeError as exc:
            bad.append((number, f"not JSON: {exc.msg} at column {exc.colno}"))
            continue
        except LineError as exc:
            bad.append((number, str(exc)))
            continue
        last = at_ms
        (routing_account, record), = recorder.sent
        good.append(ImportLine(number, at_ms, routing_account, record))
    return good, bad


def check(lines: list[ImportLine], currencies: core.CurrencyRegistry = core.DEFAULT_CURRENCIES) -> list[Prediction]:
    """Each line's decision, predicted by the pure core on an empty ledger (system accounts open themselves)."""
    state = core.MemoryState()
    out = []
    for line in lines:
        try:
            command = command_from_wire(line.record, line.at_ms)
        except (WireError, TypeError, ValueError) as exc:
            out.append(Prediction(line.number, line.command_id, getattr(exc, "reason", core.Rejection.INVALID_COMMAND).code))
            continue
        if isinstance(command, core.OpenAccount) and routing.is_system(command.account_id):
            out.append(Prediction(line.number, line.command_id, core.Rejection.INVALID_COMMAND.code))
            continue
        for account_id in core.accounts_touched(command):
            if routing.is_system(account_id) and state.account(account_id) is None:
                currency = routing.system_currency(account_id)
                if currencies.get(currency) is not None:
                    _, opened = core.execute(state, core.OpenAccount(
                        command_id=f"open:{account_id}", client_id=routing.ENGINE_CLIENT, at_ms=line.at_ms,
                        account_id=account_id, currency=currency, policy=core.SYSTEM_POLICY), currencies)
                    state.commit(opened)
        result, changes = core.execute(state, command, currencies)
        state.commit(changes)
        out.append(Prediction(line.number, line.command_id,
                              "accepted" if result.accepted else result.reason.code))  # type: ignore[union-attr]
    return out
