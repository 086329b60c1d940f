"""LEDGER_LOG_FORMAT=json: one JSON object per log line, with the extra fields and the traceback inside it;
text stays the default and leaves logging alone; a bad value is a one-line configuration error. (The worker's
JSON lines are checked in test_prometheus.py, where a real worker runs with it.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streams import logs
from streams.config import ConfigError
from tests.harness import ROOT

SCRIPT = """
import logging
from streams import logs
print(logs.setup(), flush=True)
log = logging.getLogger("ledger.test")
log.info("drift on %s", "user:a:USD", extra={"account_id": "user:a:USD"})
try:
    1 / 0
except ZeroDivisionError:
    log.exception("failed")
logging.getLogger("uvicorn.error").warning("from uvicorn")
"""


def run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, **env})


def test_json_lines_carry_fields_and_tracebacks():
    done = run({"LEDGER_LOG_FORMAT": "json"})
    assert done.stdout.strip() == "True"
    lines = done.stderr.strip().splitlines()
    docs = [json.loads(line) for line in lines]  # every line is one JSON object
    assert [d["message"] for d in docs] == ["drift on user:a:USD", "failed", "from uvicorn"]
    assert docs[0]["account_id"] == "user:a:USD" and docs[0]["level"] == "info" and docs[0]["logger"] == "ledger.test"
    assert "ZeroDivisionError" in docs[1]["exc"] and docs[1]["level"] == "error"
    assert docs[0]["ts"].endswith("+00:00")


def test_text_is_the_default_and_left_alone():
    done = run({"LEDGER_LOG_FORMAT": ""})
    assert done.stdout.strip() == "False"
    assert not any(line.startswith("{") for line in done.stderr.splitlines())


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="LEDGER_LOG_FORMAT='xml' is not one of text, json"):
        logs.log_format({"LEDGER_LOG_FORMAT": "xml"})
    with pytest.raises(ConfigError, match="LEDGER_LOG_LEVEL"):
        logs.dict_config({"LEDGER_LOG_FORMAT": "json", "LEDGER_LOG_LEVEL": "loud"})
