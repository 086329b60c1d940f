"""`ledger ...` run as an operator runs it: a subprocess of this tree's CLI against a test ledger's topics."""
from __future__ import annotations

import os
import subprocess
import sys

from streams.config import Settings
from tests.harness import ROOT


def cli(settings: Settings, *args: str, client_id: str = "wallet") -> subprocess.CompletedProcess:
    """`ledger ARGS --client-id CLIENT_ID` against the settings' broker and topic prefix."""
    env = {**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap, "LEDGER_TOPIC_PREFIX": settings.prefix}
    return subprocess.run([sys.executable, "-m", "connectors.cli", *args, "--client-id", client_id],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
