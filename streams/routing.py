"""Where an account lives: its routing key, its partition, and the shards of system accounts.

Every producer and worker must agree on the partition of a key, whatever client library it uses, so the
partition is computed here with Kafka's own default partitioner (murmur2 of the key bytes, positive,
modulo the partition count: what the Java client does) and always passed explicitly when producing.

System accounts (ids starting with ``sys:``, e.g. ``sys:world:USD``, ``sys:fees:BTC``) are hot: every
deposit touches one. They are sharded one sub-account per partition (``sys:world:USD@3``), so a deposit
only touches the user's partition; readers report a system account as the sum of its shards.
"""
from __future__ import annotations

# The routing key of an account: the owner part of its id (``user:42:USDT`` -> ``user:42``), one rule for the
# core (which stores it) and every producer (which partitions by it).
from streams.core.model import routing_key_for  # noqa: F401  (re-exported)

SYSTEM_PREFIX = "sys:"
# client_id of the commands the ledger issues itself (expiries, shard opening, cross-partition steps).
ENGINE_CLIENT = "ledger"
SHARD_MARK = "@"


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (org.apache.kafka.common.utils.Utils.murmur2), as a signed 32-bit int."""
    m = 0x5BD1E995
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    i = 0
    for i in range(0, length - length % 4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for this key (toPositive(murmur2) % n)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions




def is_system(account_id: str) -> bool:
    return account_id.startswith(SYSTEM_PREFIX)


def shard_of(account_id: str, partition: int) -> str:
    """The sub-account of a system account that lives in `partition`."""
    assert is_system(account_id) and SHARD_MARK not in account_id, account_id
    return f"{account_id}{SHARD_MARK}{partition}"


def unsharded(account_id: str) -> str:
    """The reported system account of a shard id; other ids unchanged."""
    if is_system(account_id):
        return account_id.split(SHARD_MARK, 1)[0]
    return account_id


def system_currency(account_id: str) -> str:
    """System account ids end in their currency code (``sys:fees:BTC``)."""
    return unsharded(account_id).rsplit(":", 1)[-1]


def partition_of_account(account_id: str, partitions: int) -> int:
    """Partition of an ordinary account (system accounts have a shard in every partition)."""
    assert not is_system(account_id), account_id
    return partition_for_key(routing_key_for(account_id), partitions)
