"""The replay loader switches the cyclic garbage collector off while it loads (projections/bulk.load: a
profile put 8% of a rebuild's CPU there) and always switches it back on, whether the load ends, fails, or
skips records whose exceptions make reference cycles (broker-free: a stand-in consumer feeds it)."""
from __future__ import annotations

import gc
import weakref
from unittest import mock

import pytest

from projections import bulk
from streams import config
from tests.helpers.stub_consumer import Message, consumer_of


def _settings():
    return config.load().with_prefix("loader-gc.")


class _Cycle:
    """An object in a reference cycle, to see whether the collector ran."""

    def __init__(self):
        self.me = self


def _garbage_cycle() -> weakref.ref:
    cycle = _Cycle()
    ref = weakref.ref(cycle)
    del cycle
    return ref


@pytest.fixture(autouse=True)
def _collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    gc.enable() if was else gc.disable()


def _load(tmp_path, messages, ends, consumer=None):
    settings = _settings()
    keys = {("history", p): (0, end) for (_, p), end in ends.items()}
    sink = bulk.SqliteSink(str(tmp_path / "store.db"))
    try:
        with mock.patch.object(bulk, "Consumer", consumer or consumer_of(messages, ends, batch=2)):
            return bulk.load(settings, keys, sink, lambda n: None)
    finally:
        sink.close()


def test_the_collector_is_off_while_loading_and_on_again_after(tmp_path):
    topic = _settings().topic("history")
    messages = [Message(topic, 0, n, b"not a record") for n in range(4)]
    ends = {(topic, 0): 4}
    seen = []
    base = consumer_of(messages, ends, batch=2)

    class Watching(base):
        def consume(self, n, timeout=0):
            seen.append(gc.isenabled())
            return super().consume(n, timeout)

    loaded = _load(tmp_path, messages, ends, Watching)
    assert loaded.skipped == 4
    assert seen and not any(seen), "the collector runs while the loader consumes"
    assert gc.isenabled(), "the loader left the collector off"


def test_a_batch_that_skipped_records_has_its_cycles_collected(tmp_path):
    """Cycles made while loading (a skipped record's exception and its frames) do not wait for the end."""
    topic = _settings().topic("history")
    messages = [Message(topic, 0, n, b"not a record") for n in range(4)]
    ends = {(topic, 0): 4}
    cycles: list[weakref.ref] = []
    base = consumer_of(messages, ends, batch=2)

    class Making(base):
        def consume(self, n, timeout=0):
            if cycles:
                assert cycles[-1]() is None, "a cycle made before the last batch is still alive"
            cycles.append(_garbage_cycle())
            return super().consume(n, timeout)

    _load(tmp_path, messages, ends, Making)
    assert len(cycles) >= 2


def test_a_failing_load_switches_the_collector_back_on(tmp_path):
    topic = _settings().topic("history")
    base = consumer_of([], {(topic, 0): 4})

    class Failing(base):
        def consume(self, n, timeout=0):
            raise RuntimeError("the broker went away")

    with pytest.raises(RuntimeError, match="went away"):
        _load(tmp_path, [], {(topic, 0): 4}, Failing)
    assert gc.isenabled()
