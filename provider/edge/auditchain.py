"""The audit trail's line format and its MAC chain: sealing (the writer) and checking (`audit
verify`).

A line is one JSON object on one line (ASCII only), whose last member is `"mac"`:

    {"type":"audit","time":"...","seq":7,...,"mac":"<64 hex>"}

mac = HMAC-SHA256(audit key, previous line's mac + "\\n" + the line without its mac member),
where "the line without its mac member" is the exact text before `,"mac":"` closed by `}`, so
the check needs no canonical JSON. The audit key is derived from the installation key
(`--hmac-key-file`) with a fixed label, so it is never the key object versions use.

Each file and each provider start begins with an `audit-start` line naming the MAC it continues
(`previous`, the chain's previous link; the line is also chained on it):

    {"type":"audit-start","time":"...","seq":0,"previous":"<64 hex, or empty>","pid":7,
     "version":"...","reason":"start","mac":"<64 hex>"}

`reason` is `start` (a provider start: `previous` is the last line of the file it appended to,
seq 0) or `reopen` (SIGHUP, after logrotate renamed the file: `previous` is the last line of the
file written before, seq goes on). `previous` is empty when there is none (a new file at
start-up, stderr): a new chain. These fields have been there since the trail's first release, so
`verify` checks every trail the same way.

Deleting, reordering or editing any line breaks the next MAC. Across files, `verify` takes each
file's first line as the link: it must name the last MAC of the file given before it; one that
names a line given after it is out of order; one that names neither shows lines (or a whole
file) missing between them. What it cannot show: the end of the newest file cut off (nothing
names its last MAC yet), and what was lost just before a new chain (nothing names it) — a new
chain after another file is accepted, with its continuity unchecked, unless it starts before
that file's last line. So this is evidence of tampering once the lines have left the node, not
prevention.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from provider.core.versions import read_installation_key

RECORD = "audit"
START = "audit-start"
_LABEL = b"secrets-bridge audit trail v1"
_MAC = re.compile(r',"mac":"([0-9a-f]{64})"\}$')


def derive_key(installation_key: bytes) -> bytes:
    return hmac.new(installation_key, _LABEL, hashlib.sha256).digest()


def read_key(path: str) -> bytes:
    """The audit key, derived from the installation key file."""
    return derive_key(read_installation_key(path))


def mac_of(key: bytes, previous: str, body: str) -> str:
    return hmac.new(key, previous.encode() + b"\n" + body.encode(), hashlib.sha256).hexdigest()


def seal(key: bytes, previous: str, fields: dict[str, Any]) -> tuple[str, str]:
    """(the line, without its newline; its mac)."""
    body = json.dumps(fields, separators=(",", ":"), ensure_ascii=True, default=str)
    return seal_text(key, previous, body)


def seal_text(key: bytes, previous: str, body: str) -> tuple[str, str]:
    """`seal` of fields already encoded as one compact ASCII JSON object."""
    mac = mac_of(key, previous, body)
    return f'{body[:-1]},"mac":"{mac}"}}', mac


def unseal(line: str) -> tuple[str, str] | None:
    """(body, mac) of a sealed line, or None when it is not one."""
    found = _MAC.search(line)
    if found is None or not line.startswith("{"):
        return None
    return line[: found.start()] + "}", found.group(1)


@dataclass
class Verdict:
    """The first problem found (empty when the chain is intact), and what was seen."""

    problem: str = ""
    lines: int = 0
    #: Where a new chain starts (a start line with no MAC to continue), as "file:line".
    starts: list[str] = field(default_factory=list)
    #: Files whose first line starts a new chain: nothing links them to the file before
    #: (continuity unchecked there), as "file:line".
    unlinked: list[str] = field(default_factory=list)
    #: The first line, when it continues lines that are not given (an older file rotated away).
    continues: str = ""


def verify(key: bytes, files: Iterable[tuple[str, Iterable[str]]]) -> Verdict:
    """Check the lines of `files`, given oldest first (a rotated file before its successor).

    Within the lines, each MAC follows from the one before it. Across files, a file's first
    line (an `audit-start`) names the MAC it continues (`previous`): the previous file's last
    line, or a line given after it (out of order), or neither (lines or a whole file missing
    between them). A start line with an empty `previous` begins a new chain (a provider start
    on a new file, or on stderr): nothing links it to the file before, so only its time is
    checked against that file's end. The first line may continue an older file not given.
    """
    chain = Chain(key)
    for _where, _fields in chain.read(files):
        if chain.settled():
            break
    return chain.verdict()


class Chain:
    """Lines checked as they are read (`audit verify`, and `audit search`, which reads every
    line whatever it finds): `read` yields each line's place and fields, `verdict` says what
    the chain showed once the reading stopped."""

    def __init__(self, key: bytes) -> None:
        self._walk = _Walk(key)

    def read(
        self, files: Iterable[tuple[str, Iterable[str]]]
    ) -> Iterator[tuple[str, dict[str, Any] | None]]:
        """("file:line", its fields, or None when it is not a sealed line) of every line of
        `files`, oldest file first, each checked before it is yielded."""
        before: str | None = None
        for name, lines in files:
            number = 0
            for number, raw in enumerate(lines, 1):
                where = f"{name}:{number}"
                yield where, self._walk.line(where, raw, before if number == 1 else None)
            if number:  # an empty file is no boundary
                before = name

    def settled(self) -> bool:
        """A problem is found that no later line can change."""
        return self._walk.settled()

    def verdict(self) -> Verdict:
        return self._walk.finish()


@dataclass
class _Link:
    """A start line naming a MAC that is not the line before it: out of order when a later
    line has that MAC, else `problem` (none for an older file rotated away)."""

    order: int
    where: str
    problem: str


class _Walk:
    def __init__(self, key: bytes) -> None:
        self.key = key
        self.verdict = Verdict()
        #: The MAC the next line must follow from; None before the first sealed line.
        self.previous: str | None = None
        self.seq = -1
        self.time = ""
        #: The first problem found, by position: (line number in the whole input, text).
        self.first: tuple[int, str] | None = None
        #: Start lines waiting for the MAC they name, by that MAC; their positions, in order,
        #: and those no longer waiting.
        self.links: dict[str, list[_Link]] = {}
        self.waiting: deque[int] = deque()
        self.linked: set[int] = set()

    def settled(self) -> bool:
        """A problem is found and no line before it still waits for a MAC given later."""
        if self.first is None:
            return False
        while self.waiting and self.waiting[0] in self.linked:
            self.linked.discard(self.waiting.popleft())
        return not self.waiting or self.waiting[0] > self.first[0]

    def finish(self) -> Verdict:
        for links in self.links.values():
            for link in links:
                if link.problem:
                    self._problem(link.order, f"{link.where}: {link.problem}")
        if self.first is not None:
            self.verdict.problem = self.first[1]
        elif not self.verdict.lines:
            self.verdict.problem = "no audit lines"
        return self.verdict

    def _problem(self, order: int, text: str) -> None:
        if self.first is None or order < self.first[0]:
            self.first = (order, text)

    def line(self, where: str, raw: str, after: str | None) -> dict[str, Any] | None:
        """One line, and its fields (None when it is not a whole sealed line); `after` is the
        file before this one, at a file's first line."""
        self.verdict.lines += 1
        order = self.verdict.lines
        if not raw.endswith("\n"):
            self._problem(order, f"{where}: incomplete last line (a write cut short, or an edit)")
            return None
        parts = unseal(raw[:-1])
        fields = _fields(parts[0]) if parts else None
        if parts is None or fields is None:
            text = "not a sealed audit line: edited, or not written by secrets-bridge"
            self._problem(order, f"{where}: {text}")
            return None
        body, mac = parts
        for link in self.links.pop(mac, []):
            self.linked.add(link.order)
            text = f"out of order: it continues {where}, which is given after it"
            self._problem(link.order, f"{link.where}: {text} (give the files oldest first)")
        kind, seq = fields.get("type"), fields.get("seq")
        if kind == START:
            problem, expected = self._start(order, where, body, mac, fields, after)
        elif kind == RECORD:
            problem, expected = self._record(body, mac, seq, after), self.seq + 1
        else:
            problem, expected = "not an audit line", self.seq + 1
        if problem:
            self._problem(order, f"{where}: {problem}")
        # Go on from this line (a later line may settle a start line before it).
        self.previous, self.seq = mac, seq if isinstance(seq, int) else expected
        self.time = str(fields.get("time", ""))
        return fields

    def _start(
        self, order: int, where: str, body: str, mac: str, fields: dict[str, Any], after: str | None
    ) -> tuple[str, int]:
        declared = str(fields.get("previous", ""))
        restart = fields.get("reason") == "start"
        expected = 0 if restart else self.seq + 1
        if not hmac.compare_digest(mac_of(self.key, declared, body), mac):
            if order == 1:
                return "its MAC does not match: a wrong --hmac-key-file, or an edit", expected
            return _broken(fields.get("seq"), expected), expected
        if declared == (self.previous or ""):
            if not declared:
                self.verdict.starts.append(where)
            return "", expected
        if not declared:  # a new chain after other lines
            self.verdict.starts.append(where)
            if after is None:
                return "", expected
            if _earlier(str(fields.get("time", "")), self.time):
                return (
                    f"out of order: this new chain starts at {fields.get('time')}, before the "
                    f"end of {after} at {self.time} (give the files oldest first, unless the "
                    "node's clock was set back)",
                    expected,
                )
            self.verdict.unlinked.append(where)
            return "", expected
        if restart and (self.previous is None or after is not None):
            # A provider start names the last line of the file it appended to: not there.
            problem = (
                "the head of its file is missing: this provider start continued lines that are "
                "not before it"
            )
        elif self.previous is None:
            problem = ""  # the first file continues an older one, rotated away
            self.verdict.continues = where
        elif after is not None:
            problem = (
                f"it does not continue {after}: lines are missing between them (a whole file, "
                f"or the end of {after})"
            )
        else:
            problem = (
                "this segment does not continue the line before it: lines (or a file) are "
                "missing before it"
            )
        self.links.setdefault(declared, []).append(_Link(order, where, problem))
        self.waiting.append(order)
        return "", expected

    def _record(self, body: str, mac: str, seq: object, after: str | None) -> str:
        if self.previous is None:
            return "no audit-start line before it: the lines before it are missing"
        if hmac.compare_digest(mac_of(self.key, self.previous, body), mac):
            return ""
        if after is not None:
            return (
                f"no audit-start line begins its file, and it does not continue {after}: "
                "lines are missing before it"
            )
        return _broken(seq, self.seq + 1)


def _earlier(time: str, than: str) -> bool:
    try:
        return datetime.fromisoformat(time) < datetime.fromisoformat(than)
    except (TypeError, ValueError):
        return False


def _broken(line_seq: object, expected: int) -> str:
    text = "its MAC does not follow from the line before it: "
    if isinstance(line_seq, int) and line_seq > expected:
        gone = line_seq - expected
        return text + f"{gone} line{'s were' if gone > 1 else ' was'} deleted before it"
    return text + "this line was edited, or a line before it was deleted or replaced"


def _fields(body: str) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
