"""A secured broker for the whole session (scripts/kafka.sh start --secure, on its own port and state folder, so
the plain broker other tests use is untouched), the ledger's topics and ACLs on it, and one worker running as
the `worker` principal over SASL_SSL."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from connectors.admin import create_topics
from streams import config
from streams.config import Settings
from tests.harness import ROOT, Worker

KAFKA_SH = str(ROOT / "scripts/kafka.sh")
# Its own ports (client SASL_SSL at PORT, controller +1000, inter-broker +2000, mTLS +3000).
PORT = os.environ.get("LEDGER_SECURE_KAFKA_PORT", "29192")
PARTITIONS = 2


class SecureCluster:
    def __init__(self, state: Path):
        self.state = state
        # A TLS cluster starts slower than a plain one, the more so on a busy machine.
        self.env = {"KAFKA_READY_TIMEOUT_S": "300", **os.environ, "LEDGER_STATE": str(state), "KAFKA_PORT": PORT}

    def kafka_sh(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([KAFKA_SH, *args], env=self.env, capture_output=True, text=True, timeout=300)

    def principal_env(self, name: str, mtls: bool = False) -> dict[str, str]:
        """The KAFKA_* variables of a principal, as `scripts/kafka.sh env NAME` prints them."""
        out = self.kafka_sh("env", name, *(["--mtls"] if mtls else []))
        assert out.returncode == 0, out.stderr
        pairs = (line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        return dict(pairs)

    def password(self, name: str) -> str:
        return (self.state / "kafka/secure/users" / f"{name}.password").read_text().strip()


@pytest.fixture(scope="session")
def secure_cluster():
    state = Path(tempfile.mkdtemp(prefix="ledger-secure-"))
    cluster = SecureCluster(state)
    started = cluster.kafka_sh("start", "--secure")
    if started.returncode != 0:
        shutil.rmtree(state, ignore_errors=True)
        pytest.fail(f"scripts/kafka.sh start --secure failed:\n{started.stdout}\n{started.stderr}")
    yield cluster
    cluster.kafka_sh("stop")
    shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def prefix() -> str:
    return f"s{uuid.uuid4().hex[:8]}."


@pytest.fixture(scope="session")
def as_principal(secure_cluster, prefix):
    """as_principal(name, mtls=False) -> the Settings a process of that principal loads from its environment."""

    def settings_of(name: str, mtls: bool = False, **overrides: str) -> Settings:
        env = {**secure_cluster.principal_env(name, mtls), "LEDGER_TOPIC_PREFIX": prefix,
               "LEDGER_PARTITIONS": str(PARTITIONS), "LEDGER_CONNECT_TIMEOUT_S": "30", **overrides}
        return config.load(env)

    settings_of.env = lambda name, mtls=False: {**secure_cluster.principal_env(name, mtls),
                                                "LEDGER_TOPIC_PREFIX": prefix, "LEDGER_PARTITIONS": str(PARTITIONS)}
    return settings_of


def ledger_cli(env: dict[str, str], *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`ledger ARGS` in a process whose environment is exactly the given principal's (nothing inherited that
    could authenticate it otherwise)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "LEDGER_"))}
    return subprocess.run([sys.executable, "-m", "connectors.cli", *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="session")
def secured_ledger(secure_cluster, as_principal, prefix):
    """The admin creates the topics and applies the ACL model (`ledger acl apply`, with the defaults that name
    kafka.sh's principals); then a worker runs as `worker`."""
    create_topics(as_principal("admin"))
    applied = ledger_cli(as_principal.env("admin"), "acl", "apply")
    assert applied.returncode == 0, applied.stderr + applied.stdout
    assert f"created {prefix}results.app-a" in applied.stdout
    data = Path(tempfile.mkdtemp(prefix="ledger-secure-worker-"))
    worker_env = as_principal.env("worker")
    worker = Worker(as_principal("worker"), data, "secure-worker", extra_env=worker_env)
    worker.start()
    yield worker
    worker.stop()
    shutil.rmtree(data, ignore_errors=True)
