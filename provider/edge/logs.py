"""Logging to stderr, one line per event, JSON by default, flushed as written.

Callers pass structured context with `extra={"fields": {...}}`; never a secret value or token.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {}) or {}
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{record.levelname.lower():5} {record.name}: {record.getMessage()} {extra}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line.rstrip()


class _FlushingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        self.flush()


def configure(level: str = "info", fmt: str = "json") -> None:
    handler = _FlushingHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Store SDKs log request details (headers, URLs) at DEBUG/INFO; keep them quiet.
    for noisy in ("azure", "botocore", "aiobotocore", "urllib3", "hvac", "google", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
