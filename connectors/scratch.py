"""A throwaway ledger on a running broker: its address, a unique topic prefix with the topics created, and
the topics dropped afterwards. For benchmarks, fault runs and tests, which must never share topics.
"""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from connectors.admin import create_topics, delete_topics
from streams.config import Settings

ROOT = Path(__file__).resolve().parent.parent


def bootstrap() -> str:
    """The broker under test: KAFKA_BOOTSTRAP, else the local one of scripts/kafka.sh."""
    value = os.environ.get("KAFKA_BOOTSTRAP")
    if value:
        return value
    status = subprocess.run([str(ROOT / "scripts/kafka.sh"), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        raise RuntimeError("no Kafka broker: start one (scripts/kafka.sh start; make test and the bench targets do), "
                           "or set KAFKA_BOOTSTRAP")
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
