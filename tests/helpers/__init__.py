"""Helpers shared by the tests: record builders, the in-memory multi-partition bus, read stores and servers.

- ``tests.helpers.records``: encoded commands (``command``, ``open_account``, ``transfer``, ``tx``,
  ``place_hold``, ``batch``) and accounts placed in a chosen partition (``local_users``).
- ``tests.helpers.results``: a processor's decoded results, one command's ``answer``, a result's ``outcome``.
- ``tests.helpers.forged``: two-phase engine steps written by hand (``reserve``, ``decide``), as a forger would.
- ``tests.helpers.topics``: what a real broker's topics hold (``latest_balances``).
- ``tests.helpers.interleavings``: the bus driven with the oracles checking every step (``checked_bus``, ``send``,
  ``step``, ``finish``) and the property test's generator and driver (``operation_lists``, ``run_interleaved``).
- ``tests.helpers.bus``: ``Bus``, eight PartitionProcessors wired together without Kafka, with a seeded
  scheduler, redeliveries and crash-restores; ``assert_books_balance`` for a quiet bus.
- ``tests.helpers.trade``: the exchange example of DESIGN.md §8 on the bus (two users in two partitions).
- ``tests.helpers.read_store``: a read store filled from a scenario's partition processors (no broker).
- ``tests.helpers.served``: an app served by uvicorn on a free loopback port.
- ``tests.helpers.hashing``: one column of a read store tampered with, to show the replay hash sees it.
- ``tests.helpers.recorder``: ``Recorder``, the topics of real partition processors as ``read_topic`` returns
  them (what the oracles run over without a broker).
- ``tests.helpers.cli``: ``ledger ...`` run as a subprocess against a test ledger.

The benchmarks import none of these: what they share with the tests is the product's (a worker process:
connectors/local_worker.py; throwaway topics: connectors/scratch.py; paced load: connectors/loadgen.py).
"""
