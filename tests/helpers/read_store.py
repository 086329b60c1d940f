"""A read store filled without a broker: the history, results and balances of real partition processors (the
rules' scenario bus), applied as the projector applies them."""
from __future__ import annotations

import json

from projections.store import Record, Store
from streams.wire import account_from_record, balance_to_wire
from tests.rules.scenario import Scenario


def filled_store(path: str, s: Scenario) -> Store:
    """A read store at path with everything the scenario's partition processors published, applied as the
    projector applies it (history, results and every account's latest balance)."""
    store = Store(path)
    records = [Record("history", 0, i, v) for i, v in enumerate(s.bus.history)]
    records += [Record("results", 0, i, v) for i, v in enumerate(s.bus.results)]
    balances = [balance_to_wire(account_from_record(json.loads(raw)))  # the latest balance of every account
                for proc in s.bus.procs.values() for _, raw in proc.state.store.scan(b"a/")]
    records += [Record("balances", 0, i, v) for i, v in enumerate(balances)]
    store.apply(records, {("history", 0): len(s.bus.history), ("results", 0): len(s.bus.results),
                          ("balances", 0): len(balances)})
    return store
