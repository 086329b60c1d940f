"""The books' failure message says where each topic ends (tests/harness.py, topic_ends): a partition an open
transaction holds back shows its last stable offset below its high watermark, and is named when that offset stays
put; a partition read to its end shows how far the oracles' reader got. `ledger verify` names such a partition
as a violation (projections/ends.py)."""
from __future__ import annotations

from confluent_kafka import Producer

from projections.verify import read_streams, verify
from tests.harness import topic_ends


def _row(text: str, cell: str) -> str:
    """The line of topic_ends' text about one topic partition, e.g. cell "history[3]"."""
    found = [line for line in text.splitlines() if f" {cell}  " in line]
    assert len(found) == 1, text
    return found[0].strip()


def test_an_open_transaction_shows_its_partitions_lso_below_the_high_watermark(settings):
    producer = Producer({**settings.kafka_config(), "transactional.id": f"{settings.prefix}ends-test"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(settings.topic("history"), b"committed", b"k", partition=1)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(settings.topic("history"), b"open", b"k", partition=3)
    producer.flush(30)

    text = topic_ends(settings, read_streams(settings), settle_s=0.5)
    assert _row(text, "history[3]") == "! history[3]  first 0  LSO 0  HWM 1  read -"
    assert "the LSO did not move in 0.5 s: history[3] at 0 (HWM 1)" in text
    # The committed record and its commit marker: read to the end.
    assert _row(text, "history[1]") == "history[1]  first 0  LSO 2  HWM 2  read 1"
    assert _row(text, "changelog[3]") == "changelog[3]  first 0  LSO 0  HWM 0"  # not read by the oracles

    producer.abort_transaction(30)
    text = topic_ends(settings, read_streams(settings), settle_s=0.5)
    assert _row(text, "history[3]") == "history[3]  first 0  LSO 2  HWM 2  read -"
    assert "did not move" not in text


def test_verify_names_a_transaction_that_stays_open(settings):
    """A transaction left open in a partition hides what is committed after it from every read_committed reader:
    verify says where, and once it is aborted, says nothing of it."""
    producer = Producer({**settings.kafka_config(), "transactional.id": f"{settings.prefix}ends-verify"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(settings.topic("results"), b"open", b"k", partition=5)
    producer.flush(30)

    report = verify(settings, settle_s=0.5)
    opened = [v for v in report.violations if v.startswith("open_transaction:")]
    assert opened == ["open_transaction: results[5]: a transaction stays open at offset 0 (the log ends at 1; the "
                      "last stable offset did not move in 0.5 s): read_committed readers see nothing committed "
                      "after it"], report.violations

    producer.abort_transaction(30)
    report = verify(settings, settle_s=0.5)
    assert not [v for v in report.violations if v.startswith("open_transaction")], report.violations
