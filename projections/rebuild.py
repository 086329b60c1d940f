"""Rebuild the balances topic from the history topic and prove it byte-identical to the live one (P7).

Every history entry carries the account's seq, amount and held after the change, so the latest balance
view of an account is a pure fold of its journal (`projections.fold`, the same fold the oracles check):
posted the sum of the amounts, status from the non-posting kinds (opened, frozen, unfrozen, closed), the
last transaction id, the time of the last change. Encoded with the same schema, the
rebuilt view of every account must equal, byte for byte, the latest record of that account on the live
balances topic. `ledger rebuild-balances` compares their canonical hashes (and can write the rebuilt views to
a fresh compacted topic); a mismatch names the first differing account.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Iterable

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from connectors.admin import new_topic
from projections.fold import fold_history
from projections.topics import latest_per_account, read_topic
from schemas.codec import codec
from streams.config import Settings


def canonical_hash(encoded: dict[str, bytes]) -> str:
    """sha256 over the accounts in id order, each with its encoded Balance record."""
    digest = hashlib.sha256()
    for account_id in sorted(encoded):
        digest.update(account_id.encode() + b"\x00" + encoded[account_id] + b"\x00")
    return digest.hexdigest()


@dataclass
class RebuildReport:
    accounts: int = 0
    history_records: int = 0
    live_hash: str = ""
    rebuilt_hash: str = ""
    first_difference: str | None = None  # an account id, when the two differ
    details: list[str] = field(default_factory=list)
    unreadable: int = 0  # records on history or balances that are not the ledger's (skipped, not folded)

    @property
    def ok(self) -> bool:
        return self.live_hash == self.rebuilt_hash


def rebuild_balances(settings: Settings, into_topic: str | None = None,
                     counted: Callable[[str, Iterable], Iterable] | None = None) -> RebuildReport:
    """counted(step, records) wraps the reading of each topic (a progress bar)."""
    counted = counted or (lambda _, records: records)
    c = codec()
    records = list(counted("reading history", read_topic(settings, "history")))
    history = [r.value for r in records if r.value is not None]
    balances = list(counted("reading balances", read_topic(settings, "balances")))
    rebuilt = {a: c.encode("balance", v.record()) for a, v in fold_history(history).items()}
    live_encoded = {a: r.raw for a, r in latest_per_account(balances).items()}
    report = RebuildReport(accounts=len(rebuilt), history_records=len(history),
                           live_hash=canonical_hash(live_encoded), rebuilt_hash=canonical_hash(rebuilt),
                           unreadable=len(records) - len(history) + sum(r.value is None for r in balances))
    if not report.ok:
        for account_id in sorted(set(live_encoded) | set(rebuilt)):
            if live_encoded.get(account_id) != rebuilt.get(account_id):
                report.first_difference = account_id
                left = c.decode("balance", live_encoded[account_id]) if account_id in live_encoded else None
                right = c.decode("balance", rebuilt[account_id]) if account_id in rebuilt else None
                report.details.append(f"live {left}")
                report.details.append(f"from history {right}")
                break
    if into_topic:
        _write_topic(settings, into_topic, rebuilt)
    return report


def _write_topic(settings: Settings, topic: str, encoded: dict[str, bytes]) -> None:
    """A fresh compacted topic holding one rebuilt view per account (refuses an existing topic)."""
    admin = AdminClient(settings.kafka_config())
    admin.create_topics([new_topic(settings, admin, topic, {"cleanup.policy": "compact"})])[topic].result()
    producer = Producer({**settings.kafka_config(), "enable.idempotence": True})
    for account_id in sorted(encoded):
        producer.produce(topic, encoded[account_id], account_id.encode())
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError(f"could not write every rebuilt balance to {topic}")
