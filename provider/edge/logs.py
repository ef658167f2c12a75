"""Logging to stderr, one line per event, JSON by default, flushed as written.

Callers pass structured context with `extra={"fields": {...}}`; never a secret value or token.

Bounded (issue 32): tenants choose much of what lines carry (class names, parameters, the
problems of a class of hundreds of KiB) and how often their mounts fail, and the log shares the
node's log rotation with every other line (and, with `--audit-log -`, with the audit trail). So
each line is at most LINE_BYTES — a longer one has its fields cut, to FIELD_CHARS first, and says
`"truncated": true` — and the lines of each namespace (a `namespace` field, or logged during one
of its mounts: `TENANT`) are held to a budget of LOG_BURST_BYTES at once and
LOG_BYTES_PER_SECOND after that. Lines past it are dropped and counted; the count is written
on a line of its own (`log lines dropped`) before the namespace's next line that passes, or
before any line once it is DROPPED_EVERY seconds old, or at exit. Lines of no namespace (the
provider's own) and of the audit logger (its sink failing) are never dropped.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TextIO

from backends import registry
from provider.core.budgets import Budgets

#: The most characters (bytes: JSON lines are ASCII) of one line; a traceback counts too.
LINE_BYTES = 16 * 1024
#: What each field of a line that is too long is cut to first (a list to its first items).
FIELD_CHARS = 4096
#: Each namespace's log lines: this many bytes at once, ...
LOG_BURST_BYTES = 256 * 1024
#: ... then this many a second. A line past it is dropped, and counted.
LOG_BYTES_PER_SECOND = 4096
#: A namespace's dropped lines are reported after this many seconds at the latest.
DROPPED_EVERY = 10.0
#: The message of the line reporting them.
DROPPED_TEXT = "log lines dropped: the namespace is over its log budget"
#: Never dropped: its lines say the audit trail cannot be written, whoever's mount it was.
UNLIMITED_LOGGERS = frozenset({"secrets_bridge.audit"})

#: The namespace of the mount being served: the server sets it for each Mount (a callable
#: before the request is parsed, resolved only if a line needs it), so lines logged on a mount's
#: way without a `namespace` field count against its namespace too.
TENANT: ContextVar[str | Callable[[], str] | None] = ContextVar(
    "secrets_bridge_tenant", default=None
)


def tenant_of(record: logging.LogRecord) -> str | None:
    """The namespace whose budget `record` counts against; None for the provider's own lines."""
    if record.name in UNLIMITED_LOGGERS:
        return None
    fields = getattr(record, "fields", None)
    if fields:
        namespace = fields.get("namespace")
        if isinstance(namespace, str):
            return namespace
    value = TENANT.get()
    if value is None or isinstance(value, str):
        return value
    try:
        resolved = value()
    except Exception:  # a request that does not parse: its lines count as one namespace
        resolved = ""
    TENANT.set(resolved)
    return resolved


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
        line = _ENCODER.encode(entry)
        return line if len(line) <= LINE_BYTES else _shortened_json(entry)


# One encoder for every line: `json.dumps(..., default=str)` builds a new one per call.
_ENCODER = json.JSONEncoder(default=str)
#: Kept whole in a cut line: the line's own head.
_HEAD = ("ts", "level", "logger")


def _shortened_json(entry: dict[str, Any]) -> str:
    """`entry` within LINE_BYTES: every other member cut to a budget that shrinks until it
    fits (JSON escapes may take 6 characters a character)."""
    chars = FIELD_CHARS
    while chars >= 16:
        cut = {k: v if k in _HEAD else bounded(v, chars) for k, v in entry.items()}
        cut["truncated"] = True
        line = _ENCODER.encode(cut)
        if len(line) <= LINE_BYTES:
            return line
        chars //= 4
    return _ENCODER.encode({k: entry[k] for k in _HEAD} | {"msg": "…", "truncated": True})


def bounded(value: object, chars: int) -> object:
    """`value` cut to about `chars` characters: a string with `…`, a list or a map to its first
    items and a count of the rest; numbers as they are."""
    if isinstance(value, str):
        return value if len(value) <= chars else value[: max(chars - 1, 0)] + "…"
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        kept: list[object] = []
        used = 0
        for item in items:
            shown = bounded(item, chars)
            used += len(str(shown)) + 2
            if kept and used > chars:
                break
            kept.append(shown)
        if len(kept) < len(items):
            kept.append(f"… and {len(items) - len(kept)} more")
        return kept
    if isinstance(value, dict):
        out: dict[str, object] = {}
        used = 0
        for key, item in value.items():
            shown = bounded(item, chars)
            name = str(bounded(str(key), chars))
            used += len(name) + len(str(shown)) + 4
            if out and used > chars:
                out["…"] = f"and {len(value) - len(out)} more"
                break
            out[name] = shown
        return out
    return bounded(str(value), chars)


class TextFormatter(logging.Formatter):
    """`level logger: message key=value ...`, one line per event. Messages and fields carry
    text a pod author chose (class names, parameters), so control characters are escaped and
    values with spaces or quotes are quoted: no value can start a line or a field of its own.
    A traceback follows on lines that start with `  | `, which no event line does."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {}) or {}
        line = self._line(record, record.getMessage(), fields)
        if len(line) > LINE_BYTES // 4 and len(line.encode("utf-8", "replace")) > LINE_BYTES:
            chars = FIELD_CHARS
            while True:
                cut = {k: bounded(v, chars) for k, v in fields.items()} | {"truncated": True}
                line = self._line(record, str(bounded(record.getMessage(), chars)), cut)
                if chars < 16 or len(line.encode("utf-8", "replace")) <= LINE_BYTES:
                    break
                chars //= 4
        if record.exc_info:
            trace = self.formatException(record.exc_info)
            lines = "".join(f"\n  | {_escape(part)}" for part in trace.splitlines())
            room = LINE_BYTES - len(line.encode("utf-8", "replace"))
            keep = room
            while len(lines.encode("utf-8", "replace")) > room and keep > 6:
                lines = lines[: keep - 1] + "…"
                keep //= 2
            line += lines
        return line

    @staticmethod
    def _line(record: logging.LogRecord, message: str, fields: dict[str, Any]) -> str:
        extra = " ".join(f"{_escape(str(k))}={_value(v)}" for k, v in fields.items())
        line = f"{record.levelname.lower():5} {record.name}: {_escape(message)} {extra}"
        return line.rstrip()


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


class BoundedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that holds each namespace's lines to its budget (of bytes) and writes
    the counts of dropped lines."""

    def __init__(
        self,
        stream: TextIO | None = None,
        budgets: Budgets | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(stream)
        self.budgets = budgets or Budgets(LOG_BURST_BYTES, LOG_BYTES_PER_SECOND)
        self._clock = clock
        self._swept = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            now = self._clock()
            tenant = tenant_of(record)
            budgets = self.budgets
            # Nothing left: dropped before it is formatted.
            if tenant is not None and not budgets.allows(tenant, 1, now):
                self._sweep(now)
                return
            line = self.format(record) + self.terminator
            if tenant is not None:
                if not budgets.allows(tenant, len(line), now):
                    self._sweep(now)
                    return
                budgets.spend(tenant, len(line))
                dropped, since = budgets.dropped(tenant)
                if dropped:  # reported before the namespace's next line that passes
                    self._report(tenant, dropped, since)
                    budgets.carried(tenant)
            self._sweep(now)
            self.stream.write(line)
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def _sweep(self, now: float, *, everything: bool = False) -> None:
        """Report the counts DROPPED_EVERY old (looked at once a second), or all of them."""
        if everything or now - self._swept >= 1.0:
            self._swept = now
            self.budgets.sweep(now, self._report, older_than=DROPPED_EVERY, everything=everything)

    def _report(self, tenant: str, dropped: int, since: float) -> bool:
        record = logging.LogRecord(
            "secrets_bridge.logs", logging.WARNING, "", 0, DROPPED_TEXT, (), None
        )
        record.fields = {
            "namespace": tenant,
            "dropped": dropped,
            "seconds": round(self._clock() - since, 1),
        }
        self.stream.write(self.format(record) + self.terminator)
        self.flush()
        return True

    def close(self) -> None:
        """Report every count not reported yet (at exit: logging.shutdown closes handlers)."""
        try:
            if self.stream is not None and not getattr(self.stream, "closed", False):
                self._sweep(self._clock(), everything=True)
        finally:
            super().close()


def configure(level: str = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    # StreamHandler flushes after every record: a line is on stderr as soon as it is logged.
    handler = BoundedHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Every Mount writes a line. Records skip what neither formatter prints — the caller's file
    # and line (a stack walk), thread and process names (measured: BENCHMARKS.md, "Log records
    # without caller, thread and process"); the logging HOWTO's "Optimization" section names
    # these switches.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    # Store SDKs log request details (headers, URLs) at DEBUG/INFO; keep them quiet. Each
    # store names its own (`SDK_LOGGERS` in its options.py): the registry is the list of stores.
    for noisy in ("asyncio", *registry.sdk_loggers()):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
