"""Logging to stderr, one line per event, JSON by default, flushed as written.

Callers pass structured context with `extra={"fields": {...}}`; never a secret value or token.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        # The timestamp's seconds are formatted once per second, not once per line.
        self._second = -1
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        entry: dict[str, Any] = {
            "ts": f"{self._stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry)


# One encoder for every line: `json.dumps(..., default=str)` builds a new one per call.
_ENCODER = json.JSONEncoder(default=str)


class TextFormatter(logging.Formatter):
    """`level logger: message key=value ...`, one line per event. Messages and fields carry
    text a pod author chose (class names, parameters), so control characters are escaped and
    values with spaces or quotes are quoted: no value can start a line or a field of its own.
    A traceback follows on lines that start with `  | `, which no event line does."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {}) or {}
        extra = " ".join(f"{_escape(str(k))}={_value(v)}" for k, v in fields.items())
        line = f"{record.levelname.lower():5} {record.name}: {_escape(record.getMessage())} {extra}"
        line = line.rstrip()
        if record.exc_info:
            trace = self.formatException(record.exc_info)
            line += "".join(f"\n  | {_escape(part)}" for part in trace.splitlines())
        return line


# C0 and C1 controls, DEL, and the Unicode line and paragraph separators.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NEEDS_QUOTES = re.compile(r'[\s"=]|^$')


def _escape(text: str) -> str:
    return _CONTROL.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    char = match.group(0)
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
    return named or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def _value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = _escape(text)
    if _NEEDS_QUOTES.search(text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def configure(level: str = "info", fmt: str = "json") -> None:
    # StreamHandler flushes after every record: a line is on stderr as soon as it is logged.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Every Mount writes a line. Records skip what neither formatter prints — the caller's file
    # and line (a stack walk), thread and process names — which was ~40 % of a line's cost
    # (25 -> 14 µs); the logging HOWTO's "Optimization" section names these switches.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    # Store SDKs log request details (headers, URLs) at DEBUG/INFO; keep them quiet.
    for noisy in ("azure", "botocore", "aiobotocore", "urllib3", "hvac", "google", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
