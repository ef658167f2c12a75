"""The gcp selectors: every Secret Manager secret of a project (or a region) with a name prefix
and labels (docs/selectors.md).

    select: |
      - project: my-project        # required: Google names every secret by its project, as
                                   # upstream's resourceName does
        location: us-central1      # optional: regional secrets, on the regional endpoint
        namePrefix: app-           # each file is the secret id after the prefix
        labels: {team: payments}   # each label must match
        directory: app

Google's list filter only narrows the listing (`name:` is a substring match on the name, not a
prefix): each secret listed is checked here against the prefix and the labels, so the filter's
semantics can never widen a selection.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.gcp.names import ID, LOCATION, MAX_LOCATION, SHORT_ID
from provider.core.model import hashed_once
from provider.core.parsing import Problems, expect_map, expect_str

SELECT_KEYS = frozenset({"project", "location", "namePrefix", "labels"})
#: Google's own bounds: labels per secret, and the length of a label's key or value.
MAX_LABELS = 64
MAX_LABEL = 63

_PROJECT = re.compile(ID)
_LOCATION = re.compile(LOCATION)
_PREFIX = re.compile(SHORT_ID)


@hashed_once
@dataclass(frozen=True)
class GcpSelection:
    """The secrets of `project` (in `location`, if regional) whose id starts with `prefix` and
    which carry every one of `labels`; at most `limit` of them."""

    project: str
    location: str | None
    prefix: str
    labels: tuple[tuple[str, str], ...]
    limit: int

    @property
    def parent(self) -> str:
        base = f"projects/{self.project}"
        return f"{base}/locations/{self.location}" if self.location else base

    def describe(self) -> str:
        labels = ",".join(f"{k}={v}" for k, v in self.labels)
        return f"{self.parent}/secrets/{self.prefix}*" + (f" labels {labels}" if labels else "")

    def list_filter(self) -> str:
        """Google's list filter for it: a narrowing only (see `matches`)."""
        terms = [f"name:{self.prefix}"] if self.prefix else []
        terms += [f"labels.{k}={v}" if v else f"labels.{k}:*" for k, v in self.labels]
        return " AND ".join(terms)

    def matches(self, secret_id: str, labels: Mapping[str, str]) -> bool:
        return secret_id.startswith(self.prefix) and all(labels.get(k) == v for k, v in self.labels)


def selection(
    entry: Mapping[str, Any], store: object, limit: int, where: str, problems: Problems
) -> GcpSelection | None:
    """A `select` entry of the gcp store: `project`, and `namePrefix`, `labels` or both."""
    count = len(problems.items)
    project = expect_str(entry.get("project"), f"{where}.project", problems, required=True)
    if project and not _PROJECT.fullmatch(project):
        problems.add(f"{where}.project: {project[:80]!r} is not a project id or number")
    location = _location(entry.get("location"), f"{where}.location", problems)
    prefix = expect_str(entry.get("namePrefix"), f"{where}.namePrefix", problems)
    if prefix and not _PREFIX.fullmatch(prefix):
        problems.add(
            f"{where}.namePrefix: {prefix[:80]!r} cannot start a secret id (at most 255 letters, "
            "digits, '-' and '_')"
        )
    labels = _labels(entry.get("labels"), f"{where}.labels", problems)
    if not prefix and not labels and "namePrefix" not in entry and "labels" not in entry:
        problems.add(
            f"{where}: give namePrefix, labels or both; a selector names what it takes, not a "
            "whole project"
        )
    if len(problems.items) > count:
        return None
    return GcpSelection(project, location, prefix, labels, limit)


def _location(value: Any, field: str, problems: Problems) -> str | None:
    location = expect_str(value, field, problems)
    if not location:
        return None
    if location == "global":
        problems.add(f"{field}: global secrets have no location; leave location out")
    elif len(location) > MAX_LOCATION or not _LOCATION.fullmatch(location):
        problems.add(
            f"{field}: {location[:80]!r} is not a Secret Manager location (lower-case letters, "
            f"digits and '-', at most {MAX_LOCATION} characters, e.g. us-central1)"
        )
    return location


def _labels(value: Any, field: str, problems: Problems) -> tuple[tuple[str, str], ...]:
    """`labels: {team: payments}`, each key and value as Google allows them."""
    if value is None or value == "":
        return ()
    labels = expect_map(value, field, problems)
    if labels is None:
        return ()
    if not labels:
        problems.add(f"{field}: empty; give at least one label, or leave labels out")
    if len(labels) > MAX_LABELS:
        problems.add(f"{field}: {len(labels)} labels, over Google's {MAX_LABELS} per secret")
        return ()
    found: list[tuple[str, str]] = []
    for key, raw in labels.items():
        text = expect_str(raw, f"{field}.{str(key)[:MAX_LABEL]}", problems)
        problem = _label_problem(key, text)
        if problem:
            problems.add(f"{field}: {problem}")
        else:
            found.append((str(key), text))
    return tuple(sorted(found))


def _label_problem(key: object, value: str) -> str | None:
    if not isinstance(key, str) or not key:
        return f"the key {str(key)[:80]!r} is not a label key"
    shown = key[:80]
    if len(key) > MAX_LABEL or not key[0].isalpha() or not _label_text(key):
        return (
            f"the key {shown!r} is not a label key (a lower-case letter, then lower-case letters, "
            f"digits, '-' and '_', at most {MAX_LABEL})"
        )
    if len(value) > MAX_LABEL or not _label_text(value):
        return (
            f"the value of {shown!r} is not a label value (lower-case letters, digits, '-' and "
            f"'_', at most {MAX_LABEL})"
        )
    return None


def _label_text(text: str) -> bool:
    return text == text.lower() and all(c.isalnum() or c in "_-" for c in text)
