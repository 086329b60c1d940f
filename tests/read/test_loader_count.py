"""How many loaders a rebuild starts by default: one per idle core, from the machine's CPU ticks over a
short sample that replay takes before it asks the broker for anything (bulk.CoreSample)."""
from __future__ import annotations

from projections import bulk


def test_the_sample_is_the_machines_idle_ticks_as_cores(monkeypatch):
    # Two cores; over the sample 160 of 200 ticks were idle (iowait counts as idle): 1.6 cores.
    ticks = iter([(1_000, 5_000), (1_160, 5_200)])
    monkeypatch.setattr(bulk, "_cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(bulk.os, "cpu_count", lambda: 2)
    idle = bulk.CoreSample(least_s=0.01).idle_cores()
    assert idle is not None and abs(idle - 1.6) < 1e-9, idle
    assert bulk.loaders(idle) == 2


def test_no_ticks_counted_means_unknown(monkeypatch):
    ticks = iter([(10, 100), (10, 100)])
    monkeypatch.setattr(bulk, "_cpu_ticks", lambda: next(ticks))
    assert bulk.CoreSample(least_s=0.0).idle_cores() is None
    monkeypatch.setattr(bulk, "_cpu_ticks", lambda: None)
    assert bulk.CoreSample(least_s=0.0).idle_cores() is None


def test_a_busy_machine_gets_one_loader_and_an_unknown_one_every_core(monkeypatch):
    monkeypatch.setattr(bulk.os, "cpu_count", lambda: 2)
    assert bulk.loaders(0.2) == 1
    assert bulk.loaders(1.49) == 1
    assert bulk.loaders(1.5) == 2
    assert bulk.loaders(7.0) == 2
    assert bulk.loaders(None) == 2
