"""An AWS `select` entry (docs/selectors.md): Secrets Manager secrets by name prefix and tags,
or SSM parameters under a path.

    select: |
      - namePrefix: app/            # Secrets Manager (the default objectType)
        tags: {team: payments, pci:}   # every tag must match; a key without a value: any value
        directory: app
      - objectType: ssmparameter
        path: /app/config
        recursive: true

A tag given as `key:` (null) means "has the tag, whatever its value"; `key: ""` means the empty
value, which AWS allows as a value of its own (reading "" as "any" would widen a selection past
what the class wrote). Names and tags are bounded by AWS's own limits and by the characters the
ListSecrets filter accepts, so a selector AWS would refuse fails when the class is parsed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from backends.aws.refs import AwsSelection, AwsStore, Service
from provider.core.parsing import Problems, expect_map, expect_str, parse_bool

SELECT_KEYS = frozenset({"objectType", "namePrefix", "tags", "path", "recursive"})
_TYPES: dict[str, Service] = {"secretsmanager": "secretsmanager", "ssmparameter": "ssm"}
#: AWS limits: secret names, tags per resource, tag key and value lengths, parameter names.
MAX_PREFIX = 512
MAX_TAGS = 50
MAX_TAG_KEY = 128
MAX_TAG_VALUE = 256
MAX_PATH = 1011
# The characters of a secret name, and of a ListSecrets filter value (less '!', its negation).
_NAME = re.compile(r"^[A-Za-z0-9/_+=.@-]+$")
_FILTER = re.compile(r"^[A-Za-z0-9 :_@/+=.-]*$")
_PATH = re.compile(r"^/[A-Za-z0-9_./-]*$")


def selection(
    entry: Mapping[str, Any], store: AwsStore, limit: int, where: str, problems: Problems
) -> AwsSelection | None:
    """One `select` entry's own keys as a selection, each problem one line in `problems`."""
    kind = expect_str(entry.get("objectType"), f"{where}.objectType", problems) or "secretsmanager"
    service = _TYPES.get(kind)
    if service is None:
        problems.add(f"{where}.objectType: expected secretsmanager or ssmparameter, got {kind!r}")
        return None
    if service == "ssm":
        return _ssm(entry, limit, where, problems)
    return _secrets(entry, limit, where, problems)


def _secrets(
    entry: Mapping[str, Any], limit: int, where: str, problems: Problems
) -> AwsSelection | None:
    for key in ("path", "recursive"):
        if key in entry:
            problems.add(f"{where}.{key}: only an ssmparameter selector takes it")
    before = len(problems.items)
    prefix = expect_str(entry.get("namePrefix"), f"{where}.namePrefix", problems)
    if prefix and len(prefix) > MAX_PREFIX:
        problems.add(f"{where}.namePrefix: {len(prefix)} characters, over AWS's {MAX_PREFIX}")
    elif prefix and not _NAME.match(prefix):
        problems.add(
            f"{where}.namePrefix: {prefix!r} has characters no secret name has "
            "(letters, digits and /_+=.@- only)"
        )
    tags = _tags(entry.get("tags"), f"{where}.tags", problems)
    if not prefix and not tags and len(problems.items) == before:
        problems.add(
            f"{where}: a secretsmanager selector needs namePrefix, tags or both (it would "
            "otherwise take every secret of the account)"
        )
    if len(problems.items) > before:
        return None
    return AwsSelection("secretsmanager", prefix, tags, limit=limit)


def _tags(value: Any, field: str, problems: Problems) -> tuple[tuple[str, str | None], ...]:
    if value is None or value == "":
        return ()
    found = expect_map(value, field, problems)
    if found is None:
        return ()
    if len(found) > MAX_TAGS:
        problems.add(f"{field}: {len(found)} tags, over AWS's {MAX_TAGS} per secret")
        return ()
    tags: list[tuple[str, str | None]] = []
    for key, tag in found.items():
        if not isinstance(key, str) or not key or len(key) > MAX_TAG_KEY:
            problems.add(
                f"{field}: the tag key {key!r} is not a string of 1 to {MAX_TAG_KEY} characters"
            )
            continue
        if not _FILTER.match(key):
            problems.add(
                f"{field}: the tag key {key!r} has characters ListSecrets cannot filter on "
                "(letters, digits, space and :_@/+=.- only)"
            )
            continue
        if tag is not None and not isinstance(tag, str):
            problems.add(f'{field}.{key}: expected a string (quote it: "{tag}"), got {tag!r}')
            continue
        if tag is not None and (len(tag) > MAX_TAG_VALUE or not _FILTER.match(tag)):
            problems.add(
                f"{field}.{key}: the value {tag!r} is over {MAX_TAG_VALUE} characters or has "
                "characters ListSecrets cannot filter on (letters, digits, space, :_@/+=.-)"
            )
            continue
        tags.append((key, tag))
    return tuple(sorted(tags))


def _ssm(
    entry: Mapping[str, Any], limit: int, where: str, problems: Problems
) -> AwsSelection | None:
    for key in ("namePrefix", "tags"):
        if key in entry:
            problems.add(f"{where}.{key}: only a secretsmanager selector takes it")
    before = len(problems.items)
    path = expect_str(entry.get("path"), f"{where}.path", problems, required=True)
    if path and len(path) > MAX_PATH:
        problems.add(f"{where}.path: {len(path)} characters, over AWS's {MAX_PATH}")
    elif path and (not _PATH.match(path) or "//" in path):
        problems.add(
            f"{where}.path: {path!r} is not a parameter path such as /app/config (a leading "
            "'/', letters, digits and _.-/ only)"
        )
    recursive = parse_bool(entry.get("recursive"), f"{where}.recursive", problems)
    if len(problems.items) > before or not path:
        return None
    return AwsSelection("ssm", path.rstrip("/") or "/", recursive=recursive, limit=limit)
