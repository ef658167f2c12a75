"""`secrets-bridge audit search`: which pods received a secret, and when — the records of an
audit trail that match a secret, a pod, a namespace and a time range, read with the chain
checked as `audit verify` checks it (docs/audit.md).

A secret matches an object of an answer whose reference contains it as whole segments (so
`app/k1` matches `GET secret/data/app/k1` and `KV secret/app/k1`, not `KV secret/app/k10`):
a listed object's `ref`, or one of a selector's `secrets`. Only answers are searched for
secrets (a refusal delivered nothing; `--pod` and `--namespace` show refusals too), and an
object recorded `absent` delivered nothing either.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from provider.edge import auditchain

#: Characters that end a segment of a reference (a path, an ARN, a resource name, a method).
_BOUNDARY = frozenset(" /:?#@=,;()'\"")
_AGE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Query:
    secret: str = ""
    #: (namespace, name) of `--pod NAMESPACE/NAME`.
    pod: tuple[str, str] | None = None
    namespace: str = ""
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class Match:
    where: str
    fields: Mapping[str, Any]
    #: The object entry and, for a secret search, the secret's reference and version.
    entry: Mapping[str, Any] | None = None
    secret: str = ""
    version: str | None = None
    #: A record's objects and selected secrets, over all its lines (a search without a secret).
    objects: int = 0
    secrets: int = 0

    def counting(self, fields: Mapping[str, Any]) -> Match:
        """This record with the objects of one more of its lines counted."""
        entries = [e for e in fields.get("objects") or () if isinstance(e, dict)]
        objects = sum(1 for e in entries if not e.get("at"))  # a slice after the first: no new one
        secrets = sum(len(e.get("secrets") or ()) for e in entries)
        return dataclasses.replace(
            self, objects=self.objects + objects, secrets=self.secrets + secrets
        )


def parse_time(text: str, flag: str, now: datetime) -> datetime:
    """An ISO 8601 time (UTC unless it says otherwise) or an age before `now` (90s, 30m, 2h,
    7d); ValueError naming the flag otherwise."""
    age = _AGE.match(text.strip())
    if age:
        return now - timedelta(seconds=float(age.group(1)) * _UNITS[age.group(2)])
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{flag} {text!r}: expected a time (2026-12-03T10:00:00Z) or an age (90s, 30m, 2h, 7d)"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def parse_pod(text: str) -> tuple[str, str]:
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise ValueError(f"--pod {text!r}: expected NAMESPACE/NAME (e.g. team-b/web-0)")
    return namespace, name


def contains(reference: str, secret: str) -> bool:
    """`secret` is in `reference` as whole segments: at its start or after a boundary, and at
    its end or before one (a secret that starts or ends with a boundary counts as one)."""
    start = reference.find(secret)
    while start >= 0:
        end = start + len(secret)
        opens = start == 0 or reference[start - 1] in _BOUNDARY or secret[0] in _BOUNDARY
        closes = end == len(reference) or reference[end] in _BOUNDARY or secret[-1] in _BOUNDARY
        if opens and closes:
            return True
        start = reference.find(secret, start + 1)
    return False


def search(
    query: Query, chain: auditchain.Chain, files: list[tuple[str, Iterator[str]]]
) -> Iterator[Match]:
    """Every match, in the trail's order, each line checked by `chain` as it is read: a
    secret's deliveries, or (no secret asked) each record once, by its first line, with the
    objects of all its lines counted."""
    record: Match | None = None
    for where, fields in chain.read(files):
        if fields is None or fields.get("type") != auditchain.RECORD:
            continue
        if not _about_matches(query, fields):
            continue
        event = fields.get("event")
        if query.secret:
            if event in ("answered", "continued"):
                yield from _secrets(query.secret, where, fields)
            continue
        if event == "continued":
            # The parts of a record are consecutive lines of the chain.
            if record is not None and record.fields.get("pod_uid") == fields.get("pod_uid"):
                record = record.counting(fields)
            continue
        if record is not None:
            yield record
        record = Match(where, fields).counting(fields)
    if record is not None:
        yield record


def _about_matches(query: Query, fields: Mapping[str, Any]) -> bool:
    if query.namespace and fields.get("namespace") != query.namespace:
        return False
    if query.pod and (fields.get("namespace"), fields.get("pod")) != query.pod:
        return False
    if query.since or query.until:
        try:
            when = datetime.fromisoformat(str(fields.get("time", "")))
        except ValueError:
            return False
        if (query.since and when < query.since) or (query.until and when > query.until):
            return False
    return True


def _secrets(secret: str, where: str, fields: Mapping[str, Any]) -> Iterator[Match]:
    for entry in fields.get("objects") or ():
        if not isinstance(entry, dict) or entry.get("source") in (None, "absent"):
            continue
        version = entry.get("version")
        versions = version if isinstance(version, list) else [version]
        selected = entry.get("secrets")
        if isinstance(selected, list):
            # A piece's secrets and versions are aligned when it holds as many of each.
            aligned = len(versions) == len(selected)
            for index, reference in enumerate(selected):
                if isinstance(reference, str) and contains(reference, secret):
                    held = versions[index] if aligned else None
                    yield Match(where, fields, entry, reference, held)
        elif isinstance(entry.get("ref"), str) and contains(entry["ref"], secret):
            yield Match(
                where, fields, entry, entry["ref"], version if isinstance(version, str) else None
            )


def text(match: Match) -> str:
    """One line: when, what, which pod (uid, service account), which class, and where."""
    fields = match.fields
    pod = f"{fields.get('namespace', '')}/{fields.get('pod', '')}"
    who = f"{pod} uid={fields.get('pod_uid', '')} sa={fields.get('serviceaccount', '')}"
    when = f"{fields.get('time', '')} {fields.get('event', '')}"
    head = f"{when} {who} class={fields.get('class', '')!r}"
    if match.entry is not None:
        entry = match.entry
        version = f" version {match.version}" if match.version is not None else ""
        into = f" into {entry.get('object', '')!r}"
        return f"{head}: {match.secret}{version} ({entry.get('source', '')}){into} [{match.where}]"
    if fields.get("event") == "answered":
        selected = f", {match.secrets} selected secrets" if match.secrets else ""
        parts = f", in {fields['parts']} lines" if "parts" in fields else ""
        return f"{head}: {match.objects} objects{selected}{parts} [{match.where}]"
    return f"{head}: {fields.get('code', '')} [{match.where}]"


def as_json(match: Match) -> str:
    fields = match.fields
    out: dict[str, Any] = {
        k: fields[k]
        for k in ("time", "event", "namespace", "pod", "pod_uid", "serviceaccount", "class")
        if k in fields
    }
    if match.entry is not None:
        out.update(
            secret=match.secret,
            version=match.version,
            object=match.entry.get("object"),
            source=match.entry.get("source"),
        )
    else:
        out["code"] = fields.get("code")
        if fields.get("event") == "answered":
            out.update(objects=match.objects, selected=match.secrets)
    out["where"] = match.where
    return json.dumps(out, separators=(",", ":"))
