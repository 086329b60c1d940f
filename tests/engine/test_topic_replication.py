"""How many replicas a new ledger topic gets (connectors.admin.topic_replication), without a broker."""
from __future__ import annotations

import pytest

from connectors.admin import CLUSTER_DEFAULT, topic_replication
from streams import config
from streams.config import ConfigError, Settings


def test_unset_replication_is_left_to_the_cluster():
    assert config.load({}).replication is None
    assert config.load({"LEDGER_REPLICATION": ""}).replication is None


def test_set_replication_is_read_and_checked():
    assert config.load({"LEDGER_REPLICATION": "2"}).replication == 2
    with pytest.raises(ConfigError, match="LEDGER_REPLICATION"):
        config.load({"LEDGER_REPLICATION": "0"})


@pytest.mark.parametrize("brokers", [3, 5])
def test_three_or_more_brokers_give_three_replicas_and_two_in_sync(brokers):
    assert topic_replication(Settings(), brokers) == (3, {"min.insync.replicas": "2"})


@pytest.mark.parametrize("brokers", [1, 2])
def test_fewer_brokers_take_the_clusters_default(brokers):
    assert topic_replication(Settings(), brokers) == (CLUSTER_DEFAULT, {})


@pytest.mark.parametrize("brokers", [1, 3])
def test_an_explicit_replication_wins(brokers):
    assert topic_replication(Settings(replication=1), brokers) == (1, {})
