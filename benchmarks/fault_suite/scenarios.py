"""The faults, one function each: inject under load, undo, and say what was done and when.

Each takes a Context while the base traffic runs and returns (what was injected, fault start, fault end) in
time.monotonic(); the runner (benchmarks/fault_suite/run.py) measures and checks the oracles around it."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from connectors.client import LedgerClient, Leg
from connectors.loadgen import LoadGenerator, Mix
from streams import crashpoints
from streams.config import Settings

from benchmarks.fault_suite.cluster import Cluster
from benchmarks.fault_suite.load import Key, SkewedClient, Workers

Fault = tuple[str, float, float]


@dataclass
class Context:
    cluster: Cluster
    settings: Settings
    workers: Workers
    rng: random.Random
    rate: float
    users: int
    workdir: Path
    kills: int = 50
    # Producers a scenario adds besides the base traffic: their clients and send times (the runner checks
    # exactly-once per client and counts their commands in the row).
    clients: list[LedgerClient] = field(default_factory=list)
    sent_at: dict[Key, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def commands_topic(self) -> str:
        return self.settings.topic("commands")


def _paced(ctx: Context, client: LedgerClient, send: Callable[[int], str | None], count: int,
           per_second: float) -> threading.Thread:
    """A thread sending count commands through send(i) at per_second, noting each send time."""
    def run() -> None:
        start = time.monotonic()
        for i in range(count):
            command_id = send(i)
            if command_id is not None:
                ctx.sent_at[(client.client_id, command_id)] = time.monotonic()
            client.poll()
            ahead = (i + 1) / per_second - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
        client.flush()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def leader_kill(ctx: Context, down_s: float = 15.0) -> Fault:
    """kill -9 of the broker leading most commands partitions; restarted after down_s."""
    c = ctx.cluster
    node = c.busiest_leader(ctx.commands_topic())
    led = sum(1 for leader in c.leaders(ctx.commands_topic()).values() if leader == node)
    start = time.monotonic()
    c.kill9(node)
    time.sleep(down_s)
    c.start()
    end = time.monotonic()
    ctx.notes.append(f"re-replicated {c.wait_fully_replicated(ctx.settings.prefix):.0f}s after the restart")
    return f"kill -9 of broker {node} (leader of {led}/{ctx.settings.partitions} commands partitions), " \
           f"back after {end - start:.0f}s", start, end


def broker_pause(ctx: Context, pause_s: float = 30.0) -> Fault:
    """SIGSTOP of the broker leading most commands partitions, past the cluster's 9 s broker session timeout and
    the workers' request timeouts (10 s, 15 s); SIGCONT after pause_s."""
    c = ctx.cluster
    node = c.busiest_leader(ctx.commands_topic())
    start = time.monotonic()
    c.pause(node)
    try:
        time.sleep(pause_s)
    finally:
        c.resume(node)
    end = time.monotonic()
    ctx.notes.append(f"re-replicated {c.wait_fully_replicated(ctx.settings.prefix):.0f}s after the resume")
    return f"SIGSTOP of broker {node} for {pause_s:.0f}s", start, end


def rolling_restart(ctx: Context) -> Fault:
    """Every broker in turn: clean stop (SIGTERM), start, wait until every partition is fully replicated."""
    c = ctx.cluster
    start = time.monotonic()
    waits = []
    for node in range(1, c.nodes + 1):
        c.terminate(node)
        c.start()
        waits.append(c.wait_fully_replicated(ctx.settings.prefix))
    end = time.monotonic()
    ctx.notes.append("re-replication per node: " + ", ".join(f"{w:.0f}s" for w in waits))
    return f"rolling restart of {c.nodes} brokers (each: SIGTERM, start, wait for full ISR)", start, end


HOT = "user:hot:USD"
HOT_LIMIT = 20_000  # the hot account's overdraft limit, minor units
HOT_FUNDING = 50_000


def hot_account(ctx: Context, producers: int = 4, debits: int = 60, per_second: float = 8.0) -> Fault:
    """One account at its overdraft limit: `producers` clients debit it concurrently (transfers to the base
    traffic's users) while one more credits it in small deposits, so it hovers at its floor."""
    opener = LedgerClient(ctx.settings, "hot-open")
    ctx.clients.append(opener)
    opened = opener.open_account(HOT, "USD", overdraft_limit=HOT_LIMIT, command_id="hot-open")
    funded = opener.post("hot-fund", [Leg("sys:world:USD", -HOT_FUNDING), Leg(HOT, HOT_FUNDING)], kind="deposit")
    opener.wait([opened, funded], 60)
    for command_id in (opened, funded):
        ctx.sent_at[(opener.client_id, command_id)] = time.monotonic()
    start = time.monotonic()
    threads = []
    for n in range(producers):
        client = LedgerClient(ctx.settings, f"hot-{n}")
        ctx.clients.append(client)
        rng = random.Random(ctx.rng.random())

        def debit(i: int, client=client, rng=rng, n=n) -> str:
            amount = rng.randint(200, 2_000)
            to = f"user:{rng.randrange(ctx.users)}:USD"
            return client.post(f"hot-{n}-{i}", [Leg(HOT, -amount), Leg(to, amount)])
        threads.append(_paced(ctx, client, debit, debits, per_second))
    payer = LedgerClient(ctx.settings, "hot-pay")
    ctx.clients.append(payer)

    def credit(i: int) -> str:
        return payer.post(f"hot-pay-{i}", [Leg("sys:world:USD", -500), Leg(HOT, 500)], kind="deposit")
    threads.append(_paced(ctx, payer, credit, debits, per_second))
    for t in threads:
        t.join()
    end = time.monotonic()
    return f"{producers} producers x {debits} debits + 1 x {debits} credits on one account (limit " \
           f"-{HOT_LIMIT}, funded {HOT_FUNDING})", start, end


def rebalances(ctx: Context, changes: int = 6, every_s: float = 8.0) -> Fault:
    """Workers added and removed under load: w3 and w4 join and leave in turn (a rebalance each time)."""
    start = time.monotonic()
    plan = ["+w3", "+w4", "-w3", "-w4", "+w3", "-w3", "+w4", "-w4"][:changes]
    for step in plan:
        if step[0] == "+":
            ctx.workers.add(step[1:], wait_ready=False)
        else:
            ctx.workers.remove(step[1:])
        time.sleep(every_s)
    end = time.monotonic()
    return f"{len(plan)} membership changes ({' '.join(plan)}), one every {every_s:.0f}s", start, end


def clock_skew(ctx: Context, skew_s: float = 600.0, seconds: float = 20.0) -> Fault:
    """Producers whose clocks are skew_s ahead and behind send the same mix on the same accounts (their record
    timestamps are the ledger's time), with holds that expire by the ahead producer's clock; one producer two
    hours ahead shows what the broker does with records stamped that far in the future."""
    start = time.monotonic()
    threads = []
    for name, skew in (("ahead", skew_s), ("behind", -skew_s)):
        client = SkewedClient(ctx.settings, f"skew-{name}")
        client.skew_ms = int(skew * 1000)
        ctx.clients.append(client)
        gen = LoadGenerator(client, seed=ctx.rng.randrange(1 << 30), mix=Mix(users=ctx.users), run_id=f"skew-{name}")
        threads.append(_paced(ctx, client, lambda i, gen=gen: gen.next_command(), int(ctx.rate / 4 * seconds),
                              ctx.rate / 4))
    ahead = ctx.clients[-2]

    def expiring_hold(i: int) -> str:
        expires = int(time.time() * 1000) + ahead.skew_ms + 2_000  # two seconds on the ahead producer's clock
        return ahead.place_hold(f"skew-exp-{i}", f"user:{i % ctx.users}:USD", 100, expires_at_ms=expires)
    threads.append(_paced(ctx, ahead, expiring_hold, 20, 1.0))
    far = SkewedClient(ctx.settings, "skew-far")
    far.skew_ms = 2 * 3600 * 1000
    for i in range(5):
        far.post(f"far-{i}", [Leg("sys:world:USD", -100), Leg("user:0:USD", 100)], kind="deposit")
    far.flush()
    for t in threads:
        t.join()
    # Holds left to expire 21-35 s on by a right clock, placed after the skewed load (whose records, stamped
    # 10 min ahead, would expire them at once): they fall due after the 20 s of load that follow the fault,
    # when only a worker's tick (streams/ticks.py) expires them, while the oracles wait for a quiet point and
    # read.
    on_time = SkewedClient(ctx.settings, "skew-none")
    ctx.clients.append(on_time)
    for i in range(10):
        expires = int(time.time() * 1000) + 21_000 + 1_500 * i
        command_id = on_time.place_hold(f"skew-due-{i}", f"user:{(7 * i) % ctx.users}:USD", 1,
                                        expires_at_ms=expires)
        ctx.sent_at[(on_time.client_id, command_id)] = time.monotonic()
    on_time.flush()
    end = time.monotonic()
    if far.refused:
        ctx.notes.append(f"the broker refused {far.refused}/5 records stamped 2 h ahead "
                         f"({getattr(far, 'refusal', '')}); LedgerClient drops such a delivery failure silently")
    else:
        ctx.clients.append(far)  # accepted: its commands must be answered like any other
        ctx.sent_at.update({(far.client_id, f"far-{i}"): time.monotonic() for i in range(5)})
        ctx.notes.append("records stamped 2 h ahead were accepted by the broker")
    return f"producer clocks +{skew_s / 60:.0f} min and -{skew_s / 60:.0f} min on shared accounts, 20 holds " \
           f"expiring by the fast clock, 10 by the wall clock 21-35 s on, 5 records +2 h", start, end


def worker_kills(ctx: Context) -> Fault:
    """ctx.kills stops of worker w1 while w2 keeps running: of every five, two kill -9 at a random moment, one
    exit at the transaction commit (crash point), one kill -9 that wipes its state, one wipe and exit in the
    middle of the restore that follows (crash point during_restore)."""
    w = ctx.workers.unsupervised("w1")
    start = time.monotonic()
    tally: dict[str, int] = {}
    for i in range(ctx.kills):
        point = w.extra_env.pop("LEDGER_CRASH_AT", None)
        if point:
            code = w.wait_exit(300)
            how = point.split(":")[0] + ("" if code == crashpoints.EXIT_CODE else f" (exit {code}!)")
        else:
            time.sleep(ctx.rng.uniform(0.5, 2.5))
            w.kill9()
            how = "kill -9"
        mode = i % 5
        if mode in (3, 4):
            w.wipe_state()
            how += " + wipe" if how == "kill -9" else ""
        if mode == 1:
            w.extra_env["LEDGER_CRASH_AT"] = f"during_transaction_commit:{ctx.rng.randint(2, 20)}"
        elif mode == 4:
            w.extra_env["LEDGER_CRASH_AT"] = "during_restore:1"
        tally[how] = tally.get(how, 0) + 1
        w.start(wait_ready=False)
    if w.extra_env.pop("LEDGER_CRASH_AT", None):
        w.wait_exit(300)
        w.start(wait_ready=False)
    end = time.monotonic()
    ctx.workers.running["w1"] = w  # supervised again
    ctx.notes.append("stops: " + ", ".join(f"{k} {v}" for k, v in tally.items()))
    return f"{ctx.kills} stops of one of 2 workers (kill -9, at commit, with wiped state, during restore)", \
        start, end


def _mount_tmpfs(path: Path, size_mb: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    return done.returncode == 0


def _fill(path: Path) -> Path:
    """Write zeros into path until the filesystem is full; returns the filler file."""
    filler = path / "filler"
    with open(filler, "wb") as f:
        block = b"\0" * (1 << 20)
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass
    return filler


def worker_disk_full(ctx: Context, full_s: float = 20.0) -> Fault:
    """Worker w2's state directory on a small tmpfs that is filled up under load for full_s, then freed."""
    w = ctx.workers.unsupervised("w2")
    w.stop()
    disk = ctx.workdir / "w2-disk"
    if not _mount_tmpfs(disk, 64):
        ctx.workers.add("w2")
        ctx.notes.append("skipped: no permission to mount a tmpfs here")
        now = time.monotonic()
        return "skipped (no mount permission)", now, now
    try:
        w.data_dir = disk / "w2"
        ctx.workers.add("w2")  # supervised: it is restarted whenever it exits
        time.sleep(5)
        start = time.monotonic()
        filler = _fill(disk)
        time.sleep(full_s)
        filler.unlink()
        end = time.monotonic()
        time.sleep(5)
    finally:
        w = ctx.workers.unsupervised("w2")
        w.stop()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
        w.data_dir = ctx.workdir / "w2"
        ctx.workers.add("w2", wait_ready=False)
    return f"state dir of 1 of 2 workers full (tmpfs 64 MB) for {full_s:.0f}s", start, end


def broker_disk_full(ctx: Context, full_s: float = 20.0) -> Fault:
    """Broker 3's log directory moved onto a small tmpfs, filled up under load, freed after full_s; the broker,
    which stops when its only log directory fails, is then started again."""
    c = ctx.cluster
    node = c.nodes
    data = c.log_dir(node)
    keep = data.with_name("data.keep")
    c.terminate(node)
    shutil.move(str(data), str(keep))
    used_mb = int(sum(f.stat().st_size for f in keep.rglob("*") if f.is_file()) / 2**20)
    if not _mount_tmpfs(data, used_mb + 96):
        data.rmdir() if data.exists() else None
        shutil.move(str(keep), str(data))
        c.start()
        ctx.notes.append("skipped: no permission to mount a tmpfs here")
        now = time.monotonic()
        return "skipped (no mount permission)", now, now
    try:
        shutil.copytree(keep, data, dirs_exist_ok=True)
        c.start()
        c.wait_fully_replicated(ctx.settings.prefix)
        start = time.monotonic()
        filler = _fill(data)
        time.sleep(full_s)
        filler.unlink()
        stopped = not c.alive(node)
        if stopped:
            c.start()
        end = time.monotonic()
        ctx.notes.append(f"broker {node} {'stopped itself (log dir offline) and was restarted' if stopped else 'kept running'}")
        c.wait_fully_replicated(ctx.settings.prefix)
    finally:
        if c.alive(node):
            c.terminate(node)
        shutil.rmtree(keep)
        shutil.copytree(data, keep)
        subprocess.run(["umount", "-l", str(data)], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
        shutil.move(str(keep), str(data))
        c.start()
        c.wait_fully_replicated(ctx.settings.prefix)
    return f"log dir of broker {node} full (tmpfs) for {full_s:.0f}s", start, end


SCENARIOS: dict[str, Callable[[Context], Fault]] = {
    "leader-kill": leader_kill,
    "broker-pause": broker_pause,
    "rolling-restart": rolling_restart,
    "hot-account": hot_account,
    "rebalances": rebalances,
    "clock-skew": clock_skew,
    "worker-kills": worker_kills,
    "worker-disk-full": worker_disk_full,
    "broker-disk-full": broker_disk_full,
}
