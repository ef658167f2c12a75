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

Bounded under abuse (issue 32): a tenant makes the provider refuse its own mounts as often as its
pods retry, with classes of hundreds of KiB, and a trail whose disk fills fails every namespace's
mounts. So every line is bounded (names and references cut, a cut reference followed by its
SHA-256; a line longer than LINE_BYTES is split across chained lines, below); a refusal
records a summary of its class (the first REFUSED_OBJECTS objects,
`object_count`, `class_digest`, the message's first MESSAGE_BYTES); a pod's refusals
of one class with the same code and message are written once per REPEATS_EVERY, the ones
between counted (`repeats` on that pod and class's next line); and each namespace writes at most
REFUSAL_RECORDS refusal lines per REFUSAL_WINDOW, the rest counted (`dropped` on the namespace's
next line). Counts no line carried within a while are written on lines of their own (`repeated`,
`dropped`), and at shutdown. An answer is always written, with no budget: no access goes
unrecorded.

Every line is at most LINE_BYTES. An answer that would need more (many objects, a selector's
secrets: each named, with its version) is one record in several consecutive lines of the chain:
the first, `"event":"answered"`, says `"parts": N`; the others are `"event":"continued"` with
`"part": 2..N`; each names the pod and class again (so any one line answers "who", alone) and
carries some of the objects, a long list of an object (`secrets`, `version`) cut into slices that
say where they start (`"at"`). So a record costs about what its objects cost, however they are
split: a selector's secrets cost no more than the same secrets listed by name (docs/audit.md).

The line format and its MAC chain are in provider/edge/auditchain.py. Writes are synchronous
(one `write` per line, from the event loop, so lines never interleave and the chain's order is
the file's): a file sink appends with O_APPEND and no fsync — a line is in the kernel's page
cache, not necessarily on disk, when the answer is sent.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import stat
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

from provider import __version__
from provider.core.budgets import Budgets
from provider.core.metrics import Metrics
from provider.edge import auditchain
from provider.mount.auditing import Served, class_digest
from provider.mount.mounting import MountInput, MountResult

log = logging.getLogger("secrets_bridge.audit")

#: What the driver (and the pod's FailedMount event) sees when the trail cannot be written.
UNWRITABLE_TEXT = (
    "secrets-bridge cannot write its audit trail (--audit-log), so it serves no secret; "
    "see the provider's log"
)
#: How far back a file is read at start-up for the MAC of its last line.
TAIL_BYTES = 1024 * 1024
#: Tenant-chosen text (class and backend names) is cut to this many bytes, as the line writes
#: them (JSON-escaped: a non-ASCII character takes 6).
NAME_BYTES = 253
#: An object's name, its reference and a store, as the class names them, are cut to this many
#: bytes as written; a cut reference is followed by the SHA-256 of the whole (`ref_sha256`).
REF_BYTES = 512
#: No line is longer than this, its newline included: a longer record is split into parts.
LINE_BYTES = 16 * 1024
#: What a line adds around its fields: type, time, seq, event, parts and the MAC (≤ 200 bytes).
_FRAME_BYTES = 256
#: At most what a record's fields but its objects take (six names of NAME_BYTES, a store of
#: REF_BYTES, the code and counts).
_HEAD_BYTES = 6 * (NAME_BYTES + 20) + REF_BYTES + 20 + 200
#: The list members of an object entry that a long record cuts into slices.
_SLICED = ("secrets", "version")
#: A refusal records the first objects its class asked for (and `object_count`), ...
REFUSED_OBJECTS = 3
#: ... and the first bytes (as written) of the message the driver got (itself at most 4 KiB).
MESSAGE_BYTES = 1024
#: A pod's refusals of one class with the same code and message get one line per this many
#: seconds; those between are counted, and the pod and class's next line carries the count.
REPEATS_EVERY = 600.0
#: Pods and classes whose refusals are counted (least recently refused forgotten first; a count
#: forgotten that way is written on a line of its own).
MAX_COUNTED = 8192
#: Refusal lines each namespace may write: REFUSAL_RECORDS at once, then one every
#: REFUSAL_WINDOW / REFUSAL_RECORDS seconds; past that they are counted (`dropped`).
REFUSAL_RECORDS = 30
REFUSAL_WINDOW = 60.0
#: How often counts that no line carried yet are looked at (written once they are this old:
#: REPEATS_EVERY since a pod's last refusal, REFUSAL_WINDOW since a namespace's first drop).
SWEEP_EVERY = 10.0


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


@dataclass(slots=True)
class _Counted:
    """A pod's refusals of one class: the last one written, and those counted since."""

    #: The pod and class, as its lines name them (for a `repeated` line).
    about: dict[str, Any]
    #: hash((code, message)) of the refusal written.
    outcome: int
    code: str
    written: float
    last: float
    count: int = 0


@dataclass
class _Counts:
    counted: OrderedDict[tuple[str, str], _Counted] = field(default_factory=OrderedDict)
    #: How many `counted` entries each pod uid has (an answer looks no further when none).
    pods: dict[str, int] = field(default_factory=dict)
    swept: float = 0.0


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
        self._counts = _Counts()
        # Read when built, so a test can shorten them.
        self._every = REPEATS_EVERY
        self._window = REFUSAL_WINDOW
        #: Each namespace's refusal lines (answers have no budget).
        self._budgets = Budgets(REFUSAL_RECORDS, REFUSAL_RECORDS / REFUSAL_WINDOW)

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
        """Record an answer, always (no budget); False when it could not be written (the answer
        must not go). It carries the counts of its pod and class and of its namespace."""
        now = self._clock()
        fields = self._about(request)
        fields["backend"] = _cut(result.backend, NAME_BYTES)
        fields.update(_objects(result.served))
        if result.refresh is not None:  # the class's own reuse policy (refreshInterval)
            fields["refresh_s"] = result.refresh
        fields["code"] = "OK"
        counts = self._counts
        pod = request.pod
        key = (pod.uid, class_digest(request.params)) if pod.uid in counts.pods else None
        counted = counts.counted.get(key) if key is not None else None
        if counted is not None and counted.count:
            fields["repeats"] = counted.count
        dropped, _ = self._budgets.dropped(pod.namespace)
        if dropped:
            fields["dropped"] = dropped
        written = self._record("answered", fields, at=now)
        if written:
            if key is not None and counted is not None:
                self._forget(key)  # answered: its next refusal is written
            self._budgets.carried(pod.namespace)
        self._sweep(now)
        return written

    def refused(self, request: MountInput | None, code: str, message: str) -> bool:
        """Record a refusal, or count it: True unless a line was due and could not be written
        (the refusal is sent either way)."""
        now = self._clock()
        counts = self._counts
        outcome = hash((code, message))
        about = self._about(request)
        key: tuple[str, str] | None = None
        if request is None:  # a request that did not parse: no pod, no class to count by
            namespace = ""
        else:
            namespace = request.pod.namespace
            digest = class_digest(request.params)
            key = (request.pod.uid, digest)
            about["class_digest"] = digest
        counted = counts.counted.get(key) if key is not None else None
        if key is not None and counted is not None:
            counts.counted.move_to_end(key)
            counted.last = now
            if counted.outcome == outcome and now - counted.written < self._every:
                counted.count += 1
                self._sweep(now)
                return True
        if not self._budgets.allows(namespace, 1, now):  # counted
            self._sweep(now)
            return True
        fields = dict(about)
        if request is not None:
            requested = self._requested(request.params)
            fields.update(_objects(requested[:REFUSED_OBJECTS]))
            fields["object_count"] = len(requested)
        fields["code"] = code
        fields["message"] = _cut(message, MESSAGE_BYTES)
        if counted is not None and counted.count:
            fields["repeats"] = counted.count
        dropped, _ = self._budgets.dropped(namespace)
        if dropped:
            fields["dropped"] = dropped
        written = self._try("refused", fields, at=now)
        if written:
            self._budgets.spend(namespace, 1)
            self._budgets.carried(namespace)
            if key is not None:
                self._count(key, _Counted(about, outcome, code, now, now), now)
        self._sweep(now)
        return written

    def close(self) -> None:
        """Write the counts no line carried yet, then close the sink."""
        self._sweep(self._clock(), everything=True)
        self._sink.close()

    def _count(self, key: tuple[str, str], counted: _Counted, now: float) -> None:
        counts = self._counts
        if key not in counts.counted:
            counts.pods[key[0]] = counts.pods.get(key[0], 0) + 1
        counts.counted[key] = counted
        counts.counted.move_to_end(key)
        while len(counts.counted) > MAX_COUNTED:
            oldest = next(iter(counts.counted))
            if not self._repeated(oldest, counts.counted[oldest], now):
                self._forget(oldest)  # the sink fails (counted there): memory stays bounded

    def _forget(self, key: tuple[str, str]) -> None:
        counts = self._counts
        if counts.counted.pop(key, None) is not None:
            left = counts.pods[key[0]] - 1
            if left:
                counts.pods[key[0]] = left
            else:
                del counts.pods[key[0]]

    def _repeated(self, key: tuple[str, str], counted: _Counted, now: float) -> bool:
        """Write a pod and class's count that no line carried (False: not written, kept)."""
        if counted.count:
            fields = {**counted.about, "code": counted.code, "repeats": counted.count}
            fields["last"] = _time(counted.last)
            if not self._try("repeated", fields, at=now):
                return False
        self._forget(key)
        return True

    def _sweep(self, now: float, *, everything: bool = False) -> None:
        """Write the counts that waited long enough for a line to carry them (all of them at
        shutdown), at most once per SWEEP_EVERY."""
        counts = self._counts
        if not everything and now - counts.swept < SWEEP_EVERY:
            return
        counts.swept = now
        while counts.counted:
            key, counted = next(iter(counts.counted.items()))
            if not everything and now - counted.last < self._every:
                break  # the rest were refused more recently
            if not self._repeated(key, counted, now):
                return
        report = functools.partial(self._dropped, now)
        self._budgets.sweep(now, report, older_than=self._window, everything=everything)

    def _dropped(self, now: float, namespace: str, dropped: int, since: float) -> bool:
        """Write a namespace's count of refusals that no line carried (False: not written)."""
        fields: dict[str, Any] = {"type": auditchain.RECORD}
        if namespace:
            fields["namespace"] = namespace
        fields.update(dropped=dropped, since=_time(since))
        return self._try("dropped", fields, at=now)

    def _about(self, request: MountInput | None) -> dict[str, Any]:
        fields: dict[str, Any] = {"type": auditchain.RECORD}
        if request is None:
            return fields
        pod, params = request.pod, request.params
        fields.update(
            namespace=_cut(pod.namespace, NAME_BYTES),
            pod=_cut(pod.name, NAME_BYTES),
            pod_uid=_cut(pod.uid, NAME_BYTES),
            serviceaccount=_cut(pod.service_account, NAME_BYTES),
        )
        fields["class"] = _cut(params.get("secretProviderClass", ""), NAME_BYTES)
        fields["backend"] = _cut(params.get("backend", ""), NAME_BYTES)
        return fields

    def _record(self, event: str, fields: dict[str, Any], *, at: float) -> bool:
        """Write a record in one line, or, when that line would pass LINE_BYTES, in parts
        (False when any line could not be written). Each object is encoded once."""
        objects = fields.pop("objects", [])
        encoded = [_ENCODE(entry) for entry in objects]
        for part, (name, line, raw) in enumerate(_parts(event, fields, objects, encoded)):
            if not self._try(name, line, at=at, objects=raw):
                if part:
                    log.error(
                        "the audit record was written only in part",
                        extra={"fields": {"parts_written": part}},
                    )
                return False
        return True

    def _try(
        self,
        event: str,
        fields: dict[str, Any],
        *,
        header: bool = False,
        at: float | None = None,
        objects: list[str] | None = None,
    ) -> bool:
        """Write one line (with the start line a reopen owes first)."""
        try:
            if self._header_due and not header:
                self._write("start", {"type": auditchain.START, "reason": "reopen"}, header=True)
                self._header_due = False
            self._write(event, fields, header=header, at=at, objects=objects)
        except OSError:
            return False
        return True

    def _write(
        self,
        event: str,
        fields: dict[str, Any],
        *,
        header: bool = False,
        at: float | None = None,
        objects: list[str] | None = None,
    ) -> None:
        """Seal and write one line, stamped `at` (now by default), ending with `objects`
        (entries already encoded) when given; OSError (any failure of the sink) is counted
        and logged."""
        now = _time(self._clock() if at is None else at)
        seq = 0 if fields.get("reason") == "start" else self._seq
        head: dict[str, Any] = {"type": fields["type"], "time": now, "seq": seq}
        if header:
            head.update(previous=self._previous, pid=os.getpid(), version=__version__)
        else:
            head["event"] = event
        body = _ENCODE({**head, **{k: v for k, v in fields.items() if k != "type"}})
        if objects is not None:
            body = f'{body[:-1]},"objects":[{",".join(objects)}]}}'
        line, mac = auditchain.seal_text(self._key, self._previous, body)
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


#: Compact ASCII JSON, as every line is written (one encoder, built once).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, default=str).encode
#: The fields each part of a record repeats: who and which class.
_ABOUT = ("type", "namespace", "pod", "pod_uid", "serviceaccount", "class", "backend")
#: One part's fields and its objects, encoded.
_Part = tuple[str, dict[str, Any], list[str]]


def _parts(
    event: str, fields: dict[str, Any], objects: list[dict[str, Any]], encoded: list[str]
) -> list[_Part]:
    """A record as lines of at most LINE_BYTES: one when it fits; else the first carries every
    field and `"parts": N`, each other `"event":"continued"`, the pod and class again and
    `"part"`; the objects (a long one in slices) go into them in order, as many as fit."""
    room = LINE_BYTES - _FRAME_BYTES - len(',"objects":[]')
    total = sum(len(text) + 1 for text in encoded)
    if total <= room - _HEAD_BYTES:  # the usual record: no need to measure the rest
        return [(event, fields, encoded)]
    head = len(_ENCODE(fields))
    if head + total <= room:
        return [(event, fields, encoded)]
    about = {k: fields[k] for k in _ABOUT if k in fields}
    room -= max(head, len(_ENCODE(about)))
    pieces: list[str] = []
    for entry, text in zip(objects, encoded, strict=True):
        fits = len(text) <= room
        pieces.extend([text] if fits else [_ENCODE(p) for p in _pieces(entry, room)])
    lines: list[list[str]] = [[]]
    used = 0
    for text in pieces:
        if lines[-1] and used + len(text) + 1 > room:
            lines.append([])
            used = 0
        lines[-1].append(text)
        used += len(text) + 1
    parts = len(lines)
    out: list[_Part] = [(event, {**fields, "parts": parts}, lines[0])]
    for number, chunk in enumerate(lines[1:], 2):
        out.append(("continued", {**about, "part": number, "parts": parts}, chunk))
    return out


def _pieces(entry: dict[str, Any], room: int) -> list[dict[str, Any]]:
    """An object's entry too long for a line, in pieces of at most `room` bytes: its long lists
    (`secrets`, and `version` when the object yielded several files) in slices, each with the
    object's other fields and `"at"`, the index of its first member. Aligned lists (a secret
    and its file's version) are sliced together."""
    base = {k: v for k, v in entry.items() if k not in _SLICED}
    secrets: list[str] = entry.get("secrets", [])
    version = entry.get("version", [])
    versions: list[str] = version if isinstance(version, list) else [version]
    if len(secrets) == len(versions):
        return _slices(base, {"secrets": secrets, "version": versions}, room)
    lists = {"secrets": secrets, "version": versions}
    return [
        p for name, column in lists.items() if column for p in _slices(base, {name: column}, room)
    ]


def _slices(base: dict[str, Any], columns: dict[str, list[str]], room: int) -> list[dict[str, Any]]:
    """Rows of equal-length `columns`, cut into pieces of `base` plus a slice of each and
    `"at"`, each at most `room` bytes (a piece holds at least one row)."""
    rows = len(next(iter(columns.values())))
    empty = len(_ENCODE({**base, "at": rows, **{name: [] for name in columns}}))
    out: list[dict[str, Any]] = []
    start, used = 0, empty
    for row in range(rows + 1):
        size = sum(_text_bytes(column[row]) + 1 for column in columns.values()) if row < rows else 0
        if row == rows or (row > start and used + size > room):
            piece = {**base, "at": start}
            piece.update({name: column[start:row] for name, column in columns.items()})
            out.append(piece)
            start, used = row, empty
        used += size
    return out


def _text_bytes(text: str) -> int:
    """Bytes of `text` as a JSON string, quotes included."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return len(text) + 2
    return len(_ENCODE(text))


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def _cut(text: str, limit: int) -> str:
    """`text` within `limit` bytes as a line writes it (JSON, ASCII only), ended with `…` when
    cut (between two characters)."""
    if len(text) * 2 <= limit and text.isascii() and text.isprintable():
        return text  # at most 2 bytes a character (quotes and backslashes are escaped)
    if len(text) * 12 <= limit or len(json.dumps(text)) - 2 <= limit:
        return text
    used, budget = 0, limit - 6  # `…` is written \u2026
    for index, char in enumerate(text):
        used += _json_bytes(char)
        if used > budget:
            return text[:index] + "…"
    return text


def _json_bytes(char: str) -> int:
    code = ord(char)
    if 0x20 <= code < 0x7F:
        return 2 if char in '"\\' else 1
    if code < 0x20:
        return 2 if char in "\b\f\n\r\t" else 6
    return 6 if code < 0x10000 else 12


def _objects(served: tuple[Served, ...]) -> dict[str, Any]:
    """The store(s) and each object's entry: a reference and, when answered, its source and
    version (a list when the object yielded several files); a selector's, `selected` (how many
    secrets it delivered) and `secrets` (each one's reference). Names, references, stores and
    versions are cut to REF_BYTES; a cut object reference is followed by the SHA-256 of the
    whole."""
    stores = list(dict.fromkeys(_cut(s.store, REF_BYTES) for s in served))
    objects = []
    for s in served:
        ref = _cut(s.ref, REF_BYTES)
        entry: dict[str, Any] = {"object": _cut(s.name, REF_BYTES), "ref": ref}
        if ref is not s.ref:
            entry["ref_sha256"] = hashlib.sha256(s.ref.encode("utf-8", "surrogatepass")).hexdigest()
        if len(stores) > 1:
            entry["store"] = _cut(s.store, REF_BYTES)
        if s.source is not None:
            entry["source"] = s.source
        if s.selected:
            entry["selected"] = len(s.selected)
            entry["secrets"] = [_cut(ref, REF_BYTES) for ref in s.selected]
        if s.versions:
            versions = [_cut(v, REF_BYTES) for v in s.versions]
            entry["version"] = versions[0] if len(versions) == 1 else versions
        objects.append(entry)
    # Each object names its own store when there are several: the list is only a summary.
    return {"store": _cut("; ".join(stores), REF_BYTES), "objects": objects}
