"""Structured logging: one JSON object per line (ts, level, logger, msg, plus extra fields).

    log.info("round done", extra={"session_id": sid, "request_id": rid, "accepted": 3})
    -> {"ts": "2025-01-01T12:00:00.123Z", "level": "INFO", "logger": "orchestrator", "msg": "round done",
        "session_id": "...", "request_id": "...", "accepted": 3}
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

# Attributes every LogRecord has; anything else on a record came in through `extra=`.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def _timestamp(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event = {
            "ts": _timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                event[key] = value
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """Human-readable variant: `ts LEVEL logger: msg key=value ...`."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={v}" for k, v in vars(record).items() if k not in _RECORD_ATTRS and not k.startswith("_")
        )
        line = f"{_timestamp(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        line = f"{line} {extras}" if extras else line
        return f"{line}\n{self.formatException(record.exc_info)}" if record.exc_info else line


def configure(level: str | int = "INFO", json: bool = True, stream: TextIO | None = None) -> None:
    """Route the root logger to one stderr handler (replacing earlier ones) with the chosen format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
