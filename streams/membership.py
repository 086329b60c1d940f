"""The worker's membership of its consumer group, in the form a transactional producer sends with its offsets.

A worker commits each batch in one Kafka transaction on one producer (streams/engine.py), and that transaction
also commits the batch's commands offsets for the workers' group with the member id and generation under which
the worker was assigned those partitions (exactly-once v2, KIP-447). The group coordinator refuses them from a
member that is no longer in the group or from an earlier generation (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID),
so a worker that lost its partitions (paused past its session, then woken) cannot commit: its transaction is
aborted. Between two rebalances the generation does not move while a batch is committed: Faust waits for the
batch in flight before it rejoins the group (faust/app/base.py, `_on_partitions_revoked`, `wait_empty`).

The commands are consumed by Faust's aiokafka consumer, while confluent-kafka's producer takes the membership
only as librdkafka serialises it (`Consumer.consumer_group_metadata()` returns these bytes, and
`send_offsets_to_transaction` reads them back with `rd_kafka_consumer_group_metadata_read`): "CGMDv2:", the
generation (int32, host order), the group id, the member id (each NUL-terminated), then 1 if there is no group
instance id, else 0 and the instance id, NUL-terminated. The group, member and generation come from aiokafka's
group coordinator when Faust hands the worker its partitions (streams/app.py).
"""
from __future__ import annotations

import struct

MAGIC = b"CGMDv2:"


def group_metadata(group_id: str, generation: int, member_id: str, instance_id: str | None = None) -> bytes:
    """The membership as confluent-kafka's producer takes it for `send_offsets_to_transaction`. A generation below
    0 with no member id is what a consumer outside any generation holds (aiokafka's reset state), and the group
    coordinator checks nothing for it: refused, it would turn the fence off."""
    if generation < 0 or not member_id:
        raise ValueError(f"not a member of a generation (generation {generation}, member id {member_id!r})")
    for name, text in (("group id", group_id), ("member id", member_id), ("instance id", instance_id or "")):
        if not text.isprintable() or not text.isascii():  # librdkafka refuses anything else when it reads them
            raise ValueError(f"{name} {text!r} is not printable ASCII")
    instance = b"\x01" if instance_id is None else b"\x00" + instance_id.encode() + b"\x00"
    return MAGIC + struct.pack("=i", generation) + group_id.encode() + b"\x00" + member_id.encode() + b"\x00" \
        + instance
