"""An Azure class's selectors: every enabled secret of the vault with a name prefix and tags.

    select: |
      - namePrefix: app-          # secrets whose name starts with it (Key Vault names: letters,
        tags:                     #   digits, '-'; matched ignoring case, as Key Vault names are)
          team: payments          # and that carry every one of these tags (exact, case-sensitive)
        directory: app            # files app/<name after the prefix>

Key Vault lists a vault's secrets with no server-side filter, so the prefix and tags are matched
as the pages arrive (backends/azure/listing.py). The `select` list is a plain YAML list of maps,
as in every store, unlike the upstream `objects` shape of this dialect.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provider.core.model import hashed_once
from provider.core.parsing import Problems, expect_map, expect_str

SELECT_KEYS = frozenset({"namePrefix", "tags"})
#: Bounds of a selector's tags (Azure's tag limits: names 512, values 256 characters).
MAX_TAGS = 50
MAX_TAG_NAME = 512
MAX_TAG_VALUE = 256
# A name prefix is the start of a Key Vault name: 1-127 letters, digits and hyphens.
_PREFIX = re.compile(r"^[-A-Za-z0-9]{1,127}$")


@hashed_once
@dataclass(frozen=True)
class AzureSelection:
    """Every enabled secret whose name starts with `prefix` (ignoring case) and that carries
    every one of `tags`, at most `limit` of them (a `select` entry)."""

    prefix: str
    #: (name, value) pairs, sorted: frozen and hashable.
    tags: tuple[tuple[str, str], ...]
    limit: int

    def describe(self) -> str:
        """`the selector app-* tagged team=payments`: the filter, never a value."""
        tagged = ", ".join(f"{k}={v}" for k, v in self.tags)
        return f"the selector {self.prefix}*" + (f" tagged {tagged}" if tagged else "")

    def matches(self, name: str, tags: Mapping[str, str] | None) -> bool:
        if not name.lower().startswith(self.prefix.lower()):
            return False
        held = tags or {}
        return all(held.get(k) == v for k, v in self.tags)


def selection(
    entry: Mapping[str, Any], limit: int, where: str, problems: Problems
) -> AzureSelection | None:
    """A `select` entry's `namePrefix` and `tags`; at least one of them (a selector names what
    it takes: an empty one would mount the whole vault)."""
    before = len(problems.items)
    prefix = expect_str(entry.get("namePrefix"), f"{where}.namePrefix", problems).strip()
    if prefix and not _PREFIX.match(prefix):
        problems.add(
            f"{where}.namePrefix {prefix[:130]!r}: Key Vault names are 1-127 letters, digits "
            "and '-', so a prefix is too"
        )
    tags = _tags(entry.get("tags"), f"{where}.tags", problems)
    if not prefix and not tags and tags is not None:
        problems.add(
            f"{where}: a Key Vault selector needs namePrefix, tags or both (it would otherwise "
            "take every secret of the vault)"
        )
    if len(problems.items) > before or tags is None:
        return None
    return AzureSelection(prefix, tags, limit)


def _tags(value: Any, where: str, problems: Problems) -> tuple[tuple[str, str], ...] | None:
    """The tags a secret must carry, as sorted pairs; None after a problem."""
    if value is None or value == "":
        return ()
    found = expect_map(value, where, problems)
    if found is None:
        return None
    if len(found) > MAX_TAGS:
        problems.add(f"{where}: {len(found)} tags, over the limit of {MAX_TAGS}")
        return None
    pairs: list[tuple[str, str]] = []
    ok = True
    for raw_name, raw_value in found.items():
        name = expect_str(raw_name, f"{where} (a tag name)", problems)
        text = expect_str(raw_value, f"{where}.{name}", problems)
        if not name or len(name) > MAX_TAG_NAME:
            problems.add(f"{where}: a tag name must be 1-{MAX_TAG_NAME} characters")
            ok = False
        elif len(text) > MAX_TAG_VALUE:
            problems.add(f"{where}.{name}: a tag value is at most {MAX_TAG_VALUE} characters")
            ok = False
        pairs.append((name, text))
    return tuple(sorted(pairs)) if ok else None
