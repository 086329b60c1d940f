"""Traffic with timings for the fault suite: the load generator's business-event mix at a steady rate (each
command's send time noted), a read_committed reader of the results topic (each answer's arrival time,
outcome and reason), and the workers kept running the way a supervisor would (restarted when they exit)."""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from connectors.client import LedgerClient
from connectors.loadgen import LoadGenerator, Mix
from connectors.local_worker import Worker
from schemas.codec import DecodeError, codec
from streams.config import Settings
from streams.producing import produce

Key = tuple[str, str]  # (client id, command id)


class Answers(threading.Thread):
    """Every first non-duplicate result on the results topic, with the moment this reader saw it."""

    def __init__(self, settings: Settings):
        super().__init__(daemon=True)
        self.settings = settings
        self.seen: dict[Key, tuple[float, str, str | None]] = {}  # key -> (monotonic time, outcome, reason)
        self.arrivals: list[float] = []  # every first answer's time, in arrival order
        self.lock = threading.Lock()
        self.done = threading.Event()

    def run(self) -> None:
        c = codec()
        consumer = Consumer({**self.settings.kafka_config(), "group.id": f"faults-{uuid.uuid4()}",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})
        topic = self.settings.topic("results")
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(self.settings.partitions)])
        try:
            while not self.done.is_set():
                for msg in consumer.consume(500, timeout=0.2):
                    if msg.error():
                        continue
                    now = time.monotonic()
                    try:
                        result = c.decode("result", msg.value())
                    except DecodeError:
                        continue
                    key = (result["client_id"], result["command_id"])
                    if result["duplicate"]:
                        continue
                    with self.lock:
                        if key not in self.seen:
                            self.seen[key] = (now, result["outcome"], result["reason"])
                            self.arrivals.append(now)
        finally:
            consumer.close()

    def answered(self, keys) -> int:
        with self.lock:
            return sum(k in self.seen for k in keys)

    def stop(self) -> None:
        self.done.set()
        if self.is_alive():
            self.join(10)


class SkewedClient(LedgerClient):
    """A producer whose clock is off by skew_ms: its command records carry that timestamp (CreateTime), which
    is the time the ledger decides them at. Delivery failures are counted (the broker may refuse a record
    stamped too far ahead: message.timestamp.after.max.ms)."""

    skew_ms: int = 0
    refused: int = 0

    def _produce(self, value: bytes, key: bytes, partition: int) -> None:
        topic = self.settings.topic("commands")
        headers = None if self._signer is None else self._signer.headers(topic, partition, value)

        def on_delivery(err, msg) -> None:
            if err is not None:
                self.refused += 1
                self.refusal = str(err)

        produce(self._producer, topic, value, key, partition=partition, headers=headers,
                timestamp=int(time.time() * 1000) + self.skew_ms, on_delivery=on_delivery)


class Traffic(threading.Thread):
    """The business-event mix (connectors/loadgen.py) from one client at `rate` commands/s until stop()."""

    def __init__(self, client: LedgerClient, seed: int, rate: float, users: int, run_id: str):
        super().__init__(daemon=True)
        self.client, self.rate = client, rate
        self.gen = LoadGenerator(client, seed=seed, mix=Mix(users=users), run_id=run_id)
        self.sent_at: dict[Key, float] = {}
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def open_accounts(self) -> list[str]:
        opened = self.gen.open_accounts()
        now = time.monotonic()
        self.sent_at.update({(self.client.client_id, c): now for c in opened})
        self.client.flush()
        return opened

    def run(self) -> None:
        try:
            for command_id in self.gen.paced(0, self.rate):
                self.sent_at[(self.client.client_id, command_id)] = time.monotonic()
                if self.stopping.is_set():
                    break
            self.client.flush()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)
        if self.error is not None:
            raise self.error


@dataclass
class SupervisedWorker(Worker):
    """A worker whose log stays in log_dir when its data directory moves (onto a small filesystem, say)."""

    log_dir: Path | None = None

    @property
    def log_path(self) -> Path:
        return (self.log_dir or self.data_dir) / f"{self.name}.log"


class Workers:
    """The ledger's workers as a supervisor runs them: each one that exits is started again (counted), unless
    the suite stopped or killed it on purpose and restarts it itself."""

    def __init__(self, settings: Settings, data_dir: Path, session_timeout_s: float = 10.0):
        self.settings, self.data_dir, self.session_timeout_s = settings, data_dir, session_timeout_s
        data_dir.mkdir(parents=True, exist_ok=True)
        self.running: dict[str, Worker] = {}
        self.all: dict[str, Worker] = {}
        self.restarts: list[tuple[str, int | None]] = []  # (worker, exit code) of every restart by supervision
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._supervise, daemon=True)

    def add(self, name: str, wait_ready: bool = True, **env) -> Worker:
        with self.lock:
            w = self.all.get(name) or SupervisedWorker(self.settings, self.data_dir / name, name,
                                                       session_timeout_s=self.session_timeout_s,
                                                       log_dir=self.data_dir)
            # Ticks as in production (LEDGER_TICK_S, streams/ticks.py); the oracles read at a quiet point.
            w.extra_env.update(env)
            self.all[name] = w
            w.start(wait_ready=wait_ready)
            self.running[name] = w
        if not self.thread.is_alive() and not self.done.is_set():
            self.thread.start()
        return w

    def remove(self, name: str) -> None:
        """Stop a worker cleanly (it leaves the group) and keep it stopped."""
        with self.lock:
            w = self.running.pop(name)
        w.stop()

    def unsupervised(self, name: str) -> Worker:
        """Take a worker out of supervision (the caller kills and restarts it); add() puts it back."""
        with self.lock:
            return self.running.pop(name)

    def _supervise(self) -> None:
        while not self.done.wait(0.5):
            with self.lock:
                for name, w in list(self.running.items()):
                    if w.proc is not None and w.proc.poll() is not None:
                        self.restarts.append((name, w.proc.returncode))
                        w.start(wait_ready=False)

    def stop_all(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(5)
        for w in self.all.values():
            if w.alive:
                w.resume()
                w.stop()

    def crashed(self) -> list[str]:
        """Workers whose log shows an unexpected exception."""
        return [name for name, w in self.all.items() if w.log_path.exists() and w.crashed()]
