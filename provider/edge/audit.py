"""The access audit trail (`serve --audit-log PATH|-`): one sealed JSON line per Mount answered
or refused, written before the answer leaves the provider.

Caching hides accesses from the stores' own audit logs (one read serves every pod of a service
account for --cache-ttl); this trail records each mount: the pod, its class and store, and per
object its store reference, the version answered and where the value came from (`store`,
`cache`, `coalesced`, `revalidated`, `stale`, `issued`, `reused`, `renewed`). Never a value,
token or key: only what the mount's log line and the pod's own SecretProviderClassPodStatus
already show, plus the references the class names.

An answer whose line cannot be written is not sent: the mount fails with UNAVAILABLE (the driver
retries) and `secrets_bridge_audit_failures_total{operation="write"}` counts it. A refusal whose
line cannot be written is still sent as it was (no secret leaves with it), and counted.

The line format and its MAC chain are in provider/edge/auditchain.py. Writes are synchronous
(one `write` per line, from the event loop, so lines never interleave and the chain's order is
the file's): a file sink appends with O_APPEND and no fsync — a line is in the kernel's page
cache, not necessarily on disk, when the answer is sent.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

from provider import __version__
from provider.core.metrics import Metrics
from provider.edge import auditchain
from provider.mount.auditing import Served
from provider.mount.mounting import MountInput, MountResult

log = logging.getLogger("secrets_bridge.audit")

#: What the driver (and the pod's FailedMount event) sees when the trail cannot be written.
UNWRITABLE_TEXT = (
    "secrets-bridge cannot write its audit trail (--audit-log), so it serves no secret; "
    "see the provider's log"
)
#: How far back a file is read at start-up for the MAC of its last line.
TAIL_BYTES = 1024 * 1024
#: Tenant-chosen text (class and backend names) is cut to this many characters.
NAME_CHARS = 253


class Sink(Protocol):
    def write(self, line: bytes) -> None: ...
    def reopen(self) -> None: ...
    def last_line(self) -> str | None: ...
    def close(self) -> None: ...


class FileSink:
    """Appends to a file (mode 0600); `reopen` opens the path anew (logrotate's rename)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = self._open()
        #: A line was left unterminated (a crash, or a failed write that could not be undone).
        self._cut = self._ends_cut()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _ends_cut(self) -> bool:
        st = os.fstat(self._fd)
        size = st.st_size
        if not stat.S_ISREG(st.st_mode) or not size:
            return False
        with open(self.path, "rb") as fh:
            fh.seek(size - 1)
            return fh.read(1) != b"\n"

    def write(self, line: bytes) -> None:
        data = (b"\n" + line) if self._cut else line
        before = os.fstat(self._fd).st_size
        try:
            self._write_all(data)
        except OSError:
            # A full disk may take part of a line: take it back, so the file holds whole lines.
            try:
                os.ftruncate(self._fd, before)
            except OSError:
                self._cut = True
            raise
        self._cut = False

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def reopen(self) -> None:
        fd = self._open()
        os.close(self._fd)
        self._fd = fd
        self._cut = self._ends_cut()

    def last_line(self) -> str | None:
        """The file's last whole line (to continue its chain), or None."""
        st = os.fstat(self._fd)
        if not stat.S_ISREG(st.st_mode) or not st.st_size:
            return None
        with open(self.path, "rb") as fh:
            fh.seek(max(0, st.st_size - TAIL_BYTES))
            tail = fh.read(TAIL_BYTES)
        if not tail.endswith(b"\n"):
            return None
        lines = tail[:-1].rsplit(b"\n", 1)
        return lines[-1].decode("ascii", "replace") if lines[-1] else None

    def close(self) -> None:
        os.close(self._fd)


class StreamSink:
    """Writes to a text stream (stderr, beside the log lines: audit lines start with
    `{"type":"audit`)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, line: bytes) -> None:
        self._stream.write(line.decode("ascii"))
        self._stream.flush()

    def reopen(self) -> None:
        return None

    def last_line(self) -> str | None:
        return None

    def close(self) -> None:
        return None


def open_sink(target: str) -> Sink:
    """`-` is stderr; anything else a file opened for append (OSError if it cannot be)."""
    return StreamSink(sys.stderr) if target == "-" else FileSink(target)


class AuditTrail:
    def __init__(
        self,
        sink: Sink,
        key: bytes,
        *,
        metrics: Metrics,
        requested: Callable[[Mapping[str, str]], tuple[Served, ...]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sink = sink
        self._key = key
        self._metrics = metrics
        self._requested = requested
        self._clock = clock
        self._previous = ""
        self._seq = 0
        #: A reopened file whose first line could not be written yet.
        self._header_due = False

    def start(self) -> None:
        """The first line: continues the chain of the file's last line, if it has one."""
        last = self._sink.last_line()
        parts = auditchain.unseal(last) if last else None
        self._previous = parts[1] if parts else ""
        self._write("start", {"type": auditchain.START, "reason": "start"}, header=True)

    def reopen(self) -> None:
        """SIGHUP: write to the path anew (logrotate renamed the file); the new file's first
        line names the last MAC of the old one."""
        try:
            self._sink.reopen()
        except OSError as exc:
            self._metrics.audit_failures.labels("reopen").inc()
            log.error(
                "cannot reopen the audit log; still writing to the file open before",
                extra={"fields": {"error": exc.strerror or type(exc).__name__}},
            )
            return
        fields = {"type": auditchain.START, "reason": "reopen"}
        # A failure is counted and logged; the next line written starts with it.
        self._header_due = not self._try("start", fields, header=True)

    def answered(self, request: MountInput, result: MountResult) -> bool:
        """Record an answer; False when it could not be written (the answer must not go)."""
        fields = self._about(request)
        fields["backend"] = result.backend
        fields.update(_objects(result.served))
        fields["code"] = "OK"
        return self._try("answered", fields)

    def refused(self, request: MountInput | None, code: str, message: str) -> bool:
        fields = self._about(request)
        if request is not None:
            fields.update(_objects(self._requested(request.params)))
        fields["code"] = code
        fields["message"] = message
        return self._try("refused", fields)

    def close(self) -> None:
        self._sink.close()

    def _about(self, request: MountInput | None) -> dict[str, Any]:
        fields: dict[str, Any] = {"type": auditchain.RECORD}
        if request is None:
            return fields
        pod, params = request.pod, request.params
        fields.update(
            namespace=pod.namespace,
            pod=pod.name,
            pod_uid=pod.uid,
            serviceaccount=pod.service_account,
        )
        fields["class"] = params.get("secretProviderClass", "")[:NAME_CHARS]
        fields["backend"] = params.get("backend", "")[:NAME_CHARS]
        return fields

    def _try(self, event: str, fields: dict[str, Any], *, header: bool = False) -> bool:
        try:
            if self._header_due and not header:
                self._write("start", {"type": auditchain.START, "reason": "reopen"}, header=True)
                self._header_due = False
            self._write(event, fields, header=header)
        except OSError:
            return False
        return True

    def _write(self, event: str, fields: dict[str, Any], *, header: bool = False) -> None:
        """Seal and write one line; OSError (any failure of the sink) is counted and logged."""
        now = datetime.fromtimestamp(self._clock(), UTC).isoformat(timespec="milliseconds")
        seq = 0 if fields.get("reason") == "start" else self._seq
        head: dict[str, Any] = {"type": fields.pop("type"), "time": now, "seq": seq}
        if header:
            head.update(previous=self._previous, pid=os.getpid(), version=__version__)
        else:
            head["event"] = event
        line, mac = auditchain.seal(self._key, self._previous, {**head, **fields})
        try:
            self._sink.write(line.encode("ascii") + b"\n")
        except Exception as exc:
            self._metrics.audit_failures.labels("write").inc()
            log.error(
                "cannot write the audit log",
                extra={"fields": {"error": getattr(exc, "strerror", None) or type(exc).__name__}},
            )
            raise OSError("audit trail not written") from exc
        self._previous, self._seq = mac, seq + 1
        self._metrics.audit_records.labels(event).inc()


def _objects(served: tuple[Served, ...]) -> dict[str, Any]:
    """The store(s) and each object's entry: a reference and, when answered, its source and
    version (a list when the object yielded several files)."""
    stores = list(dict.fromkeys(s.store for s in served))
    objects = []
    for s in served:
        entry: dict[str, Any] = {"object": s.name, "ref": s.ref}
        if len(stores) > 1:
            entry["store"] = s.store
        if s.source is not None:
            entry["source"] = s.source
        if s.versions:
            entry["version"] = s.versions[0] if len(s.versions) == 1 else list(s.versions)
        objects.append(entry)
    return {"store": "; ".join(stores), "objects": objects}
