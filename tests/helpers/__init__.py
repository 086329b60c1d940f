"""Helpers shared by the tests (and the benchmarks): record builders and the in-memory multi-partition bus.

- ``tests.helpers.records``: encoded commands (``command``, ``open_account``, ``transfer``, ``tx``,
  ``place_hold``, ``batch``) and accounts placed in a chosen partition (``local_users``).
- ``tests.helpers.bus``: ``Bus``, eight PartitionProcessors wired together without Kafka, with a seeded
  scheduler, redeliveries and crash-restores; ``assert_books_balance`` for a quiet bus.
- ``tests.helpers.trade``: the exchange example of DESIGN.md §8 on the bus (two users in two partitions).
"""
