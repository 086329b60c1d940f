"""How a ledger process writes its log: text (the default) or one JSON object per line.

LEDGER_LOG_FORMAT=json makes the worker, the read API, the projector and the CLI log one JSON object per
line on stderr, so a log shipper (Fluent Bit, Vector, Loki's promtail, an ELK pipeline) takes the fields as
they are instead of parsing text: `ts` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`, and
`exc` with the traceback when there is one; anything given as `extra={...}` is a field of its own.
LEDGER_LOG_LEVEL sets the level of that handler (default INFO). With the text format nothing here changes
what a process already does.
"""
from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone
from typing import Any

from streams.config import ConfigError

FORMATS = ("text", "json")
# The attributes every LogRecord has: anything else on a record came from `extra=` and becomes a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def log_format(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    value = (env.get("LEDGER_LOG_FORMAT") or "text").strip().lower()
    if value not in FORMATS:
        raise ConfigError(f"LEDGER_LOG_FORMAT={value!r} is not one of {', '.join(FORMATS)}")
    return value


def log_level(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    value = (env.get("LEDGER_LOG_LEVEL") or "INFO").strip().upper()
    if value not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(f"LEDGER_LOG_LEVEL={value!r} is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
    return value


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback is a field, never extra lines)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def json_mode(env: dict[str, str] | None = None) -> bool:
    return log_format(env) == "json"


def dict_config(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """A logging.config.dictConfig for JSON lines on stderr at the root (None for text: leave it alone).
    Faust's worker takes it as `logging_config`; uvicorn's own loggers then propagate to the root."""
    if not json_mode(env):
        return None
    level = log_level(env)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
        "root": {"level": level, "handlers": ["stderr"]},
        # uvicorn configures these with handlers of their own unless told otherwise: make them propagate.
        "loggers": {name: {"handlers": [], "propagate": True} for name in ("uvicorn", "uvicorn.error", "uvicorn.access")},
    }


def setup(env: dict[str, str] | None = None) -> bool:
    """Configure the process's logging from the environment; True when it logs JSON lines."""
    config = dict_config(env)
    if config is None:
        return False
    import logging.config

    logging.config.dictConfig(config)
    logging.captureWarnings(True)
    return True


def uvicorn_log_config(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """What to pass uvicorn as log_config: its default text setup, or None (keep ours) with JSON lines."""
    if json_mode(env):
        return None
    import uvicorn.config

    return uvicorn.config.LOGGING_CONFIG
