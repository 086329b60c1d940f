"""How many loaders a rebuild starts by default: one per idle core, where the rebuild's own process counts
as idle (it is the first loader; what it does while the sample runs is the rebuild's own work)."""
from __future__ import annotations

import time

from projections import bulk


def test_the_sample_counts_this_process_own_cpu_as_idle(monkeypatch):
    # Two cores; over a 0.2 s sample the machine's ticks say 1.1 cores idle, and this process ran 0.1 s of
    # CPU (half a core): without counting it, 1.1 would give one loader.
    ticks = iter([(0, 0), (110, 200)])  # (idle, total) ticks: 110 of 200 idle = 0.55 of the machine = 1.1 cores
    clock = iter([100.0, 100.2, 100.2])  # the sample's start, then the end (no wait left)
    own = iter([5.0, 5.1])
    monkeypatch.setattr(bulk, "_cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(bulk.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(bulk.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(bulk.time, "process_time", lambda: next(own))
    sample = bulk.CoreSample(least_s=0.2)
    idle = sample.idle_cores()
    assert idle is not None and abs(idle - 1.6) < 1e-9, idle
    assert bulk.loaders(idle) == 2


def test_a_busy_machine_gets_one_loader_and_an_unknown_one_every_core(monkeypatch):
    monkeypatch.setattr(bulk.os, "cpu_count", lambda: 2)
    assert bulk.loaders(0.2) == 1
    assert bulk.loaders(1.49) == 1
    assert bulk.loaders(1.5) == 2
    assert bulk.loaders(None) == 2
    ticks = iter([(0, 0), (10, 200)])
    monkeypatch.setattr(bulk, "_cpu_ticks", lambda: next(ticks))
    sample = bulk.CoreSample(least_s=0.05)
    time.sleep(0.05)  # this process idle: only the machine's idle ticks count
    assert bulk.loaders(sample.idle_cores()) == 1
