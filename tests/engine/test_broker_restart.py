"""The broker itself is killed (kill -9) and restarted mid-stream: workers and clients recover, books hold.

Runs its own broker (another state folder and port) so the rest of the suite is not disturbed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from connectors.client import LedgerClient, ResultTimeout
from connectors.loadgen import LoadGenerator, Mix, pump
from projections.ends import open_transactions
from tests.harness import ROOT, Worker, assert_books_ok, drop, fresh_settings

PORT = 19392


def start(script: str, env: dict) -> None:
    done = subprocess.run([script, "start"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"kafka.sh start failed:\n{done.stdout}\n{done.stderr}"


class Supervisor(threading.Thread):
    """Starts the worker again whenever it exits, as a process supervisor would: a worker ends itself when the
    broker stays away past its delivery timeout (streams/app.py), and its successor restores and carries on."""

    def __init__(self, worker: Worker):
        super().__init__(daemon=True)
        self.worker, self.done, self.restarts = worker, threading.Event(), 0
        self.start()

    def run(self) -> None:
        while not self.done.wait(1.0):
            if not self.worker.alive:
                self.restarts += 1
                self.worker.start(wait_ready=False)

    def stop(self) -> None:
        self.done.set()
        self.join(10)
        self.worker.kill9()


def skipped_markers(server_log: Path) -> str:
    """What the restarted broker's log says of the transaction markers it had to finish writing. A transaction the
    coordinator had decided (prepared to commit or abort) when the broker was killed gets its markers after the
    restart; the broker skips a partition it finds without a leader at that moment ("Couldn't find leader
    endpoint ... likely deleted"), which a restarted single-node broker's partitions are while it fences its
    previous incarnation and unfences the new one. That partition's transaction then stays open, and
    read_committed readers see nothing after its first record: docs/reliability.md, "Hazards still open"."""
    try:
        lines = server_log.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"broker log not readable: {exc}"
    wanted = ("Sending txn markers", "Couldn't find leader endpoint", "Fencing broker", "handleBrokerUnfenced")
    found = [line[:400] for line in lines if any(w in line for w in wanted)]
    return "the restarted broker's log on transaction markers (the last start):\n" + \
        ("\n".join(f"  {line}" for line in found[-20:]) if found else "  no pending transaction markers")


@pytest.fixture
def own_broker(tmp_path):
    # A restart after kill -9 recovers every log first: on a loaded 2-core machine that alone can take minutes.
    env = {**os.environ, "LEDGER_STATE": str(tmp_path / "state"), "KAFKA_PORT": str(PORT),
           "KAFKA_READY_TIMEOUT_S": "300"}
    script = str(ROOT / "scripts/kafka.sh")
    start(script, env)
    pid_file = tmp_path / "state/kafka/node1/pid"
    yield env, script, pid_file
    subprocess.run([script, "stop"], env=env, capture_output=True)


def test_worker_survives_a_broker_kill_and_restart(own_broker, tmp_path, request):
    env, script, pid_file = own_broker
    settings = fresh_settings(f"127.0.0.1:{PORT}")
    worker = Worker(settings, tmp_path / "w", "w").start()
    supervisor = Supervisor(worker)
    request.addfinalizer(supervisor.stop)  # never left running past the test, whatever failed
    client = LedgerClient(settings, "brk")
    gen = LoadGenerator(client, seed=9, mix=Mix(users=50), run_id="brk")
    client.wait(gen.open_accounts(), 60)
    sent: list[str] = []
    thread = pump(client, gen, count=1500, per_second=200, sent=sent)
    time.sleep(2.5)
    os.kill(int(Path(pid_file).read_text()), signal.SIGKILL)
    time.sleep(2)
    start(script, env)
    thread.join(120)
    # A broker killed mid-commit can lose a transaction's marker in a partition (docs/reliability.md, "Hazards
    # still open"): read_committed readers stop there until the same producer's next transaction to that
    # partition closes it, and a client waiting for results there waits for good (a rehearsal of .ci/run
    # timed out so, 869 results unseen after 300 s). With traffic the ledger heals by itself: while `ledger
    # verify` would report such a partition, more commands go through (three times at most); then every
    # result must come and the books are checked over everything sent.
    deadline = time.monotonic() + 300
    healed = 0
    while True:
        try:
            client.wait(sent, 30)
            stuck = open_transactions(settings, settle_s=5.0)
            if not stuck:
                break
        except ResultTimeout:
            stuck = open_transactions(settings, settle_s=5.0)
            if not stuck and time.monotonic() < deadline:
                continue
        if healed == 3 or time.monotonic() > deadline:
            raise AssertionError(f"results missing or transactions open after the broker's restart: "
                                 f"{', '.join(f'{e.topic}[{e.partition}] at {e.lso}' for e in stuck) or 'none open'}"
                                 f"\n{skipped_markers(pid_file.parent / 'server.log')}")
        healed += 1
        print("a transaction stays open after the broker's restart, more traffic to close it:",
              ", ".join(f"{e.topic}[{e.partition}] at {e.lso}" for e in stuck))
        more = pump(client, gen, count=300, per_second=200, sent=sent)
        more.join(60)
        deadline = max(deadline, time.monotonic() + 120)
    try:
        assert_books_ok(settings)
    except AssertionError as failure:
        raise AssertionError(f"{failure}\n{skipped_markers(pid_file.parent / 'server.log')}") from None
    client.close()
    supervisor.stop()
    drop(settings)
