"""Test and soak harness: topics under a fresh prefix, worker processes to start, kill -9, pause and resume."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from connectors.admin import create_topics, delete_topics
from streams import config
from streams.config import Settings

ROOT = Path(__file__).resolve().parent.parent


def bootstrap() -> str:
    """The broker under test: KAFKA_BOOTSTRAP, else the local one of scripts/kafka.sh."""
    value = os.environ.get("KAFKA_BOOTSTRAP")
    if value:
        return value
    status = subprocess.run([str(ROOT / "scripts/kafka.sh"), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        raise RuntimeError("no Kafka broker: run the tests with `make test`, or set KAFKA_BOOTSTRAP")
    return status.stdout.strip()


def fresh_settings(server: str, partitions: int = 8) -> Settings:
    """Settings under a unique topic prefix, with its topics created."""
    settings = Settings(bootstrap=server, prefix=f"t{uuid.uuid4().hex[:10]}.", partitions=partitions)
    create_topics(settings)
    return settings


def drop(settings: Settings) -> None:
    try:
        delete_topics(settings)
    except Exception:  # best effort: a prefix left behind harms no other test
        pass


@dataclass
class Worker:
    """One `ledger worker` process with its own data directory and log file."""

    settings: Settings
    data_dir: Path
    name: str = "w"
    session_timeout_s: float = 6.0
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self.name}.log"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "KAFKA_BOOTSTRAP": self.settings.bootstrap,
            "LEDGER_TOPIC_PREFIX": self.settings.prefix,
            "LEDGER_PARTITIONS": str(self.settings.partitions),
            "LEDGER_DATA_DIR": str(self.data_dir),
            "LEDGER_SESSION_TIMEOUT_S": str(self.session_timeout_s),
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.extra_env)
        return env

    def start(self, wait_ready: bool = True) -> "Worker":
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "a")
        log.write(f"\n==== start {self.starts} ====\n")
        log.flush()
        self.proc = subprocess.Popen([sys.executable, "-m", "connectors.cli", "worker"], cwd=ROOT, env=self.env(),
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        marker = f"==== start {self.starts - 1} ===="
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if "[^Worker]: Ready" in text[text.rfind(marker):]:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.name} not ready in {timeout_s}s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_since_start(self, start: int | None = None) -> str:
        """The log of one start (default: the latest), from its marker line to the next one."""
        start = self.starts - 1 if start is None else start
        text = self.log_path.read_text(errors="replace")
        begin = text.find(f"==== start {start} ====")
        if begin < 0:
            return ""
        end = text.find(f"==== start {start + 1} ====", begin)
        return text[begin:] if end < 0 else text[begin:end]

    def wait_log(self, needle: str, timeout_s: float = 60.0, start: int | None = None) -> str:
        """Wait until the log of a start contains needle; returns that log. Fails early if the process died."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log_since_start(start)
            if needle in text:
                return text
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited with {self.proc.returncode} before logging "
                                   f"{needle!r}:\n{self.tail()}")
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.name} did not log {needle!r} in {timeout_s}s:\n{self.tail()}")

    def wait_exit(self, timeout_s: float = 120.0) -> int:
        """The exit code once the process ends by itself (negative: killed by that signal)."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"worker {self.name} still running after {timeout_s}s:\n{self.tail()}") from None

    def stopped(self) -> bool:
        """True while the process is stopped by a signal (state T in /proc)."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def wipe_state(self) -> None:
        """Lose every partition's RocksDB (the worker must not be running): restore reads the changelog."""
        assert not self.alive, "wipe the state of a stopped worker only"
        for p in self.data_dir.glob("p*"):
            if p.name[1:].isdigit():
                shutil.rmtree(p)

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def crashed(self) -> bool:
        """True when the log shows an unexpected exception (tests assert there is none)."""
        return "Traceback" in self.log_path.read_text(errors="replace")


def broker_api_versions(server: str) -> tuple[str, int]:
    """(cluster id, broker count) as the broker reports them."""
    md = AdminClient({"bootstrap.servers": server}).list_topics(timeout=10)
    return md.cluster_id, len(md.brokers)


def load_settings() -> Settings:
    return config.load()
