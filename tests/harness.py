"""Test and soak harness: topics under a fresh prefix, worker processes to start, kill -9, pause and resume."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from connectors.admin import create_topics, delete_topics
from projections.topics import read_topic
from streams import config
from streams.config import Settings

ROOT = Path(__file__).resolve().parent.parent
# streams/engine.py's log line at the end of each restore (step 1).
RESTORED = re.compile(r"partition (\d+) restored: (\d+) changelog records from offset")


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


def assert_exactly_once(settings, client_id: str, sent: list[str]) -> None:
    """What the oracles may let pass, as a read_committed reader (read_topic) sees the topics: exactly one
    non-duplicate result per command (not even a byte-identical copy), exactly one history entry per
    account#seq, every account's seqs exactly 1..n, every balance record (not only the latest) equal to the
    fold of history at its seq, and no history for a rejected command."""
    problems: list[str] = []
    commands = [c.value for c in read_topic(settings, "commands")]
    results = [r for r in read_topic(settings, "results")]
    history = [h for h in read_topic(settings, "history")]
    balances = [b.value for b in read_topic(settings, "balances")]
    assert not list(read_topic(settings, "dlq")), "no command of this traffic is a dead letter"
    assert None not in commands, "every command decodes"

    # As a set: a command sent to a partition that owns none of its debits is forwarded, unchanged.
    ours = {c["command_id"] for c in commands if c["client_id"] == client_id}
    assert ours == set(sent), f"the commands topic differs from what the client sent: {sorted(ours ^ set(sent))[:10]}"

    decisions: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    outcome: dict[tuple[str, str], str] = {}
    for r in results:
        if not r.value["duplicate"]:
            key = (r.value["client_id"], r.value["command_id"])
            decisions[key].append(r.raw)
            outcome[key] = r.value["outcome"]
    keys = {(c["client_id"], c["command_id"]) for c in commands}
    for key in sorted(keys):
        if len(decisions.get(key, ())) != 1:
            problems.append(f"{key} has {len(decisions.get(key, ()))} non-duplicate results "
                            f"({len(set(decisions.get(key, ())))} distinct)")
    # (The engine decides some commands of its own inside a partition, with no record on the commands
    # topic: system shard opens, two-phase steps. Those are checked with everything else below.)
    for key in set(decisions) - keys:
        if key[0] == client_id:
            problems.append(f"decision for {key}, which is not on the commands topic")

    contents: dict[str, list[bytes]] = defaultdict(list)
    entries: dict[str, dict] = {}
    for h in history:
        contents[h.value["entry_id"]].append(h.raw)
        entries[h.value["entry_id"]] = h.value
    problems += [f"history entry {e} published {len(c)} times ({len(set(c))} contents)"
                 for e, c in contents.items() if len(c) != 1]
    copies = defaultdict(int)
    for h in history:
        copies[(h.value["account_id"], h.value["seq"])] += 1
    problems += [f"{a}#{seq} published {n} times" for (a, seq), n in copies.items() if n != 1]
    by_account: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for v in entries.values():
        by_account[v["account_id"]][v["seq"]].append(v)
        if outcome.get((v["client_id"], v["command_id"])) == "rejected":
            problems.append(f"history entry {v['entry_id']} of rejected command {v['command_id']}")
    fold: dict[tuple[str, int], tuple[int, int]] = {}
    for account, seqs in by_account.items():
        if sorted(seqs) != list(range(1, len(seqs) + 1)):
            problems.append(f"{account}: seqs {sorted(seqs)[:10]} are not 1..{len(seqs)}")
        posted = 0
        for seq in sorted(seqs):
            if len(seqs[seq]) != 1:
                problems.append(f"{account}#{seq} has {len(seqs[seq])} entries")
            v = seqs[seq][0]
            posted += int(v["amount"])
            if posted != int(v["posted_after"]):
                problems.append(f"{account}#{seq}: posted_after {v['posted_after']} != fold {posted}")
            fold[(account, seq)] = (posted, int(v["held_after"]))
    for b in balances:
        at = fold.get((b["account_id"], b["seq"]))
        if at != (int(b["posted"]), int(b["held"])):
            problems.append(f"balance {b['account_id']}#{b['seq']} {b['posted']}/{b['held']} != history {at}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:30])


def changelog_ends(settings: Settings) -> dict[int, int]:
    """The end offset of every partition of the changelog topic."""
    consumer = Consumer({**settings.kafka_config(), "group.id": f"ends-{uuid.uuid4()}"})
    try:
        topic = settings.topic("changelog")
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(settings.partitions)}
    finally:
        consumer.close()


def broker_api_versions(server: str) -> tuple[str, int]:
    """(cluster id, broker count) as the broker reports them."""
    md = AdminClient({"bootstrap.servers": server}).list_topics(timeout=10)
    return md.cluster_id, len(md.brokers)


def load_settings() -> Settings:
    return config.load()
