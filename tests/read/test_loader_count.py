"""How many loaders a rebuild starts by default: one per idle core, from the machine's CPU ticks over a
short sample that replay takes before it asks the broker for anything (bulk.CoreSample)."""
from __future__ import annotations

from projections import bulk


def test_the_sample_is_the_machines_idle_ticks_as_cores(monkeypatch):
    # Two cores; over the sample 160 of 200 ticks were idle (iowait counts as idle): 1.6 cores.
    ticks = iter([(1_000, 5_000), (1_160, 5_200)])
    monkeypatch.setattr(bulk, "_cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(bulk.time, "process_time", lambda: 1.0)  # this process did nothing meanwhile
    monkeypatch.setattr(bulk.os, "cpu_count", lambda: 2)
    idle = bulk.CoreSample(least_s=0.01).idle_cores()
    assert idle is not None and abs(idle - 1.6) < 1e-9, idle
    assert bulk.loaders(idle) == 2


def test_this_processs_own_work_during_the_sample_counts_as_idle(monkeypatch):
    # The rebuild prepares its loaders while the sample runs: 40 of 200 ticks idle, and 0.6 s of this process's
    # CPU (60 ticks at 100 a second) was its own: 1.0 core idle for the loaders, never more than there are.
    ticks = iter([(1_000, 5_000), (1_040, 5_200)])
    cpu = iter([10.0, 10.6])
    monkeypatch.setattr(bulk, "_cpu_ticks", lambda: next(ticks))
    monkeypatch.setattr(bulk.time, "process_time", lambda: next(cpu))
    monkeypatch.setattr(bulk.os, "sysconf", lambda name: 100)
    monkeypatch.setattr(bulk.os, "cpu_count", lambda: 2)
    idle = bulk.CoreSample(least_s=0.0).idle_cores()
    assert idle is not None and abs(idle - 1.0) < 1e-9, idle
    ticks = iter([(1_000, 5_000), (1_190, 5_200)])
    cpu = iter([10.0, 10.6])
    assert bulk.CoreSample(least_s=0.0).idle_cores() == 2


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


def _start_method_in_a_fresh_process(code: str) -> str:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent.parent
    script = f"from projections import bulk\n{code}\nprint(bulk.start_method())"
    return subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip().splitlines()[-1]


def test_loaders_fork_only_from_a_process_that_runs_one_thread():
    """A fork copies only the forking thread, so loaders fork only when no other thread runs, counted by the
    kernel: an open librdkafka client's threads (not Python's) make them spawn; once it is closed, its
    threads are joined and they fork again; so does a Python thread."""
    assert _start_method_in_a_fresh_process("") == "fork"
    client = ("from confluent_kafka import Consumer\n"
              "c = Consumer({'bootstrap.servers': '127.0.0.1:1', 'group.id': 'g'})\n")
    assert _start_method_in_a_fresh_process(client) == "spawn"
    assert _start_method_in_a_fresh_process(client + "c.close()") == "fork"
    thread = "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()"
    assert _start_method_in_a_fresh_process(thread) == "spawn"


def _queue_and_take(work, statements, taken):
    work.add(statements)
    while (statement := work.take()) is not None:
        taken.put(statement)
    taken.put(None)


def test_the_loaders_index_builds_are_shared():
    """A PostgreSQL rebuild's loaders queue their tables' index builds and take from the queue until it is
    empty (bulk.IndexWork): what one loader queued, another process takes, each once, in order."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    work = bulk.IndexWork(ctx)
    work.add(["CREATE INDEX a", "CREATE INDEX b"])  # this loader's, still queued
    taken = ctx.SimpleQueue()
    other = ctx.Process(target=_queue_and_take, args=(work, ["CREATE INDEX c"], taken))
    other.start()
    other.join(60)
    assert other.exitcode == 0
    got = []
    while (statement := taken.get()) is not None:
        got.append(statement)
    assert got == ["CREATE INDEX a", "CREATE INDEX b", "CREATE INDEX c"]
    assert work.take() is None
