"""One `ledger worker` process on this machine, with its own data directory and log file: started (waiting
until it is ready), stopped, killed -9, paused and resumed, its state read or wiped while it is down.

What the benchmarks, the fault runs and the broker tests launch workers with (benchmarks/, scripts/fuzz.py,
tests/): one launcher, so they all start a worker the way `ledger worker` runs in production.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from streams.config import Settings

ROOT = Path(__file__).resolve().parent.parent  # the source tree a worker runs from by default
# streams/engine.py's log line at the end of each restore (step 1).
RESTORED = re.compile(r"partition (\d+) restored: (\d+) changelog records from offset")


@dataclass
class Worker:
    """One `ledger worker` process with its own data directory and log file."""

    settings: Settings
    data_dir: Path
    name: str = "w"
    session_timeout_s: float = 6.0
    extra_env: dict[str, str] = field(default_factory=dict)
    root: Path = ROOT  # the source tree the worker runs from (benchmarks compare against a git worktree)
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
        self.proc = subprocess.Popen([sys.executable, "-m", "connectors.cli", "worker"], cwd=self.root, env=self.env(),
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

    def stored_changelog_offsets(self) -> dict[int, int]:
        """Per partition directory: the next changelog offset its RocksDB holds (> 0: this worker decided
        commands there or restored them). Read with the worker stopped (RocksDB locks its directory)."""
        assert not self.alive, "read the state of a stopped worker only"
        from streams.partition import PartitionState
        from streams.store import RocksStore

        offsets = {}
        for p in sorted(self.data_dir.glob("p*")):
            if p.name[1:].isdigit():
                store = RocksStore(p)
                try:
                    offsets[int(p.name[1:])] = PartitionState(store).changelog_offset()
                finally:
                    store.close()
        return offsets

    def restores(self, since: int = 0) -> list[tuple[int, int]]:
        """(partition, changelog records read) of every restore the log shows past character `since`."""
        text = self.log_path.read_text(errors="replace")[since:]
        return [(int(m.group(1)), int(m.group(2))) for m in RESTORED.finditer(text)]

    def log_size(self) -> int:
        return len(self.log_path.read_text(errors="replace"))

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
