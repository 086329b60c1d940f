"""A Kafka cluster of scripts/kafka.sh that the fault suite owns: its own state folder and ports, so killing,
pausing or filling its brokers never touches a broker anyone else uses."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts/kafka.sh")


@dataclass
class Cluster:
    state: Path  # LEDGER_STATE of scripts/kafka.sh
    port: int  # KAFKA_PORT: node i listens on port + i - 1
    nodes: int = 3

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "LEDGER_STATE": str(self.state), "KAFKA_PORT": str(self.port),
                "KAFKA_HEAP": os.environ.get("KAFKA_HEAP", "512m"),
                # A node restarted on a loaded machine may need minutes (on a timeout kafka.sh stops that node).
                "KAFKA_READY_TIMEOUT_S": os.environ.get("KAFKA_READY_TIMEOUT_S", "600")}

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + i}" for i in range(self.nodes))

    def node_dir(self, node: int) -> Path:
        return self.state / "kafka" / f"node{node}"

    def start(self) -> None:
        """Start every node that is not running (a fresh cluster, or the nodes a fault stopped)."""
        args = [SCRIPT, "start"] + (["--nodes", str(self.nodes)] if self.nodes > 1 else [])
        done = subprocess.run(args, env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"kafka.sh start failed:\n{done.stdout}\n{done.stderr}")

    def stop(self) -> None:
        subprocess.run([SCRIPT, "stop"], env=self.env, capture_output=True, text=True)

    def pid(self, node: int) -> int:
        return int((self.node_dir(node) / "pid").read_text())

    def alive(self, node: int) -> bool:
        try:
            os.kill(self.pid(node), 0)
            return True
        except (FileNotFoundError, ProcessLookupError, ValueError):
            return False

    def kill9(self, node: int) -> None:
        os.kill(self.pid(node), signal.SIGKILL)
        self._wait_gone(node)

    def terminate(self, node: int) -> None:
        """A clean stop (controlled shutdown: leaderships move away first)."""
        os.kill(self.pid(node), signal.SIGTERM)
        self._wait_gone(node, 300)  # a controlled shutdown moves leaderships first: minutes on a loaded machine

    def pause(self, node: int) -> None:
        os.kill(self.pid(node), signal.SIGSTOP)

    def resume(self, node: int) -> None:
        os.kill(self.pid(node), signal.SIGCONT)

    def _wait_gone(self, node: int, timeout_s: float = 30) -> None:
        pid = self.pid(node)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            # kafka.sh starts the JVM with setsid in the background: reap it if it is our child.
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"broker node {node} (pid {pid}) still running after {timeout_s}s")

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 5000})

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> leader broker id (node number) of a topic, as the cluster's metadata says now."""
        md = self.admin().list_topics(topic, timeout=10)
        return {p.id: p.leader for p in md.topics[topic].partitions.values()}

    def busiest_leader(self, topic: str) -> int:
        """The node that leads most partitions of the topic (ties: the lowest id)."""
        counts: dict[int, int] = {}
        for leader in self.leaders(topic).values():
            if leader > 0:
                counts[leader] = counts.get(leader, 0) + 1
        return min(counts, key=lambda n: (-counts[n], n))

    def wait_fully_replicated(self, prefix: str, timeout_s: float = 180.0) -> float:
        """Wait until every partition of the topics under prefix (and the internal ones) has its whole replica
        set in sync; returns the seconds waited."""
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            try:
                md = self.admin().list_topics(timeout=10)
                lagging = [f"{t.topic}[{p.id}]" for t in md.topics.values()
                           if t.topic.startswith(prefix) or t.topic.startswith("__")
                           for p in t.partitions.values() if len(p.isrs) < len(p.replicas) or p.leader < 0]
                if not lagging and len(md.brokers) == self.nodes:
                    return time.monotonic() - started
            except Exception:  # noqa: BLE001 - metadata may fail while a node restarts: ask again
                lagging = ["metadata"]
            if time.monotonic() > deadline:
                raise TimeoutError(f"under-replicated after {timeout_s}s: {lagging[:5]}")
            time.sleep(0.5)

    def log_dir(self, node: int) -> Path:
        return self.node_dir(node) / "data"
