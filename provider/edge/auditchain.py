"""The audit trail's line format and its MAC chain: sealing (the writer) and checking (`audit
verify`).

A line is one JSON object on one line (ASCII only), whose last member is `"mac"`:

    {"type":"audit","time":"...","seq":7,...,"mac":"<64 hex>"}

mac = HMAC-SHA256(audit key, previous line's mac + "\\n" + the line without its mac member),
where "the line without its mac member" is the exact text before `,"mac":"` closed by `}`, so
the check needs no canonical JSON. The audit key is derived from the installation key
(`--hmac-key-file`) with a fixed label, so it is never the key object versions use.

Each file and each provider start begins with an `audit-start` line naming the MAC it continues
(`previous`): the last line of the file it appended to, or of the file it wrote before a
reopen (SIGHUP, after logrotate renamed it); empty when there is none (a new file at start-up,
stderr). Deleting, reordering or editing any line breaks the next MAC; deleting the end of the
newest file, or a whole file, shows only against the next file's `previous` — so this is
evidence of tampering once the lines have left the node, not prevention.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
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
    #: Where a chain starts (a provider start with no MAC to continue), as "file:line".
    starts: list[str] = field(default_factory=list)


def verify(key: bytes, files: Iterable[tuple[str, Iterable[str]]]) -> Verdict:
    """Check the lines of `files`, given oldest first (a rotated file before its successor)."""
    verdict = Verdict()
    previous: str | None = None
    seq = -1
    for name, lines in files:
        for number, raw in enumerate(lines, 1):
            where = f"{name}:{number}"
            verdict.lines += 1
            problem, previous, seq = _check(key, raw, previous, seq, where, verdict)
            if problem:
                verdict.problem = f"{where}: {problem}"
                return verdict
    if previous is None:
        verdict.problem = "no audit lines"
    return verdict


def _check(
    key: bytes, raw: str, previous: str | None, seq: int, where: str, verdict: Verdict
) -> tuple[str, str | None, int]:
    if not raw.endswith("\n"):
        return "incomplete last line (a write cut short, or an edit)", previous, seq
    parts = unseal(raw[:-1])
    fields = _fields(parts[0]) if parts else None
    if parts is None or fields is None:
        return "not a sealed audit line: edited, or not written by secrets-bridge", previous, seq
    body, mac = parts
    kind, line_seq = fields.get("type"), fields.get("seq")
    if kind == START:
        declared = str(fields.get("previous", ""))
        if previous is not None and declared and declared != previous:
            return (
                "this segment does not continue the line before it: lines (or a file) are "
                "missing before it",
                previous,
                seq,
            )
        if previous is None or not declared:
            verdict.starts.append(where)
        chained, expected = declared, 0 if fields.get("reason") == "start" else seq + 1
    elif kind == RECORD:
        if previous is None:
            return "no audit-start line before it: the lines before it are missing", previous, seq
        chained, expected = previous, seq + 1
    else:
        return "not an audit line", previous, seq
    if not hmac.compare_digest(mac_of(key, chained, body), mac):
        if verdict.lines == 1:
            return "its MAC does not match: a wrong --hmac-key-file, or an edit", previous, seq
        return _broken(line_seq, expected), previous, seq
    return "", mac, line_seq if isinstance(line_seq, int) else expected


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
