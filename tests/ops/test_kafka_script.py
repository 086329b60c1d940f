"""scripts/kafka.sh start, restarting one node of a running 3-node cluster that does not get ready in time:
it stops only the node it started and says which, the healthy nodes keep running (once, a slow restart of
one broker took the whole cluster down).

No JVM runs: the healthy nodes are stand-ins (a process listening on the node's port, a log that says the
server started, as the script checks), and `java` on PATH is a stand-in that never gets ready."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kafka.sh"

FAKE_JAVA = """#!/bin/sh
case "$*" in *-version*) echo 'openjdk version "17.0.9"' >&2; exit 0 ;; esac
exec sleep 300
"""
LISTENER = "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); " \
           "time.sleep(300)"


def _free_base_port() -> int:
    """A base port p with p..p+2 and p+1000..p+1002 free (the script's client and controller ports)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + 1002 > 65535:
            continue
        ports = [base + i for i in range(3)] + [base + 1000 + i for i in range(3)]
        try:
            for p in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    pytest.skip("no free ports")


@pytest.mark.skipif(not (ROOT / "broker/lib/.complete").exists(), reason="broker jars not fetched")
def test_a_node_that_is_not_ready_in_time_does_not_take_the_healthy_ones_down(tmp_path):
    kdir = tmp_path / "state" / "kafka"
    base = _free_base_port()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").write_text(FAKE_JAVA)
    (bin_dir / "java").chmod(0o755)
    kdir.mkdir(parents=True)
    (kdir / "nodes").write_text("3\n")
    (kdir / "mode").write_text("plain\n")
    (kdir / "cluster.id").write_text("unitclusterid0000000000\n")
    healthy: dict[int, subprocess.Popen] = {}
    try:
        for node in (1, 2, 3):
            (kdir / f"node{node}" / "data").mkdir(parents=True)
            (kdir / f"node{node}" / "data" / "meta.properties").write_text("formatted\n")  # no format run
        for node in (1, 3):  # running and ready, as the script sees a node
            healthy[node] = subprocess.Popen([sys.executable, "-c", LISTENER, str(base + node - 1)])
            # Reaped as soon as it ends, so a stopped stand-in does not linger as a zombie the script waits for.
            threading.Thread(target=healthy[node].wait, daemon=True).start()
            (kdir / f"node{node}" / "pid").write_text(f"{healthy[node].pid}\n")
            (kdir / f"node{node}" / "server.log").write_text("[...] INFO [KafkaRaftServer nodeId=1] Kafka Server "
                                                             "started (kafka.server.KafkaRaftServer)\n")
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LEDGER_STATE": str(tmp_path / "state"),
               "KAFKA_PORT": str(base), "KAFKA_READY_TIMEOUT_S": "2"}
        done = subprocess.run(["bash", str(SCRIPT), "start", "--nodes", "3"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode != 0, done.stdout + done.stderr
        stopped = [node for node, proc in healthy.items() if proc.returncode is not None]
        assert not stopped, f"healthy node(s) {stopped} stopped: {done.stderr}"
        assert "node 2 not ready" in done.stderr, done.stderr
        assert "stopping the node(s) this call started: 2 (left running: 1 3)" in done.stderr, done.stderr
        assert not (kdir / "node2" / "pid").exists()  # the node it started, stopped
    finally:
        for proc in healthy.values():
            proc.kill()
            proc.wait()
        stray = kdir / "node2" / "pid"
        if stray.exists():
            try:
                os.kill(int(stray.read_text()), 9)
            except (ProcessLookupError, ValueError):
                pass
