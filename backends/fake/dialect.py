"""The fake backend's dialect: an in-memory store for tests and demos.

parameters:
  backend: fake
  audience: fake          # optional: require the pod's token for this audience
  objects: |
    - objectName: db.json     # file name
      secretPath: db-creds     # key in the fake store (default: objectName)
      filePermission: 0400
      extract: password        # any extension key (docs/architecture.md)
  select: |                    # optional: every secret whose path starts with `prefix`
    - prefix: app/
      directory: app           # files app/<path after the prefix>
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.fake.options import Options
from provider.core.changes import Subject
from provider.core.model import ObjectSpec, ParseContext, StorePlan, hashed_once
from provider.core.parsing import ObjectList, Problems, expect_str, file_object, parse_objects

KEYS = frozenset({"objects", "audience"})
#: A test store: a class naming it is refused unless the provider runs with this flag.
ENABLED_BY = "--enable-fake-backend"
SELECT_KEYS = frozenset({"prefix"})
OBJECT_KEYS = frozenset({"objectName", "secretPath", "filePermission"})
OBJECTS = ObjectList(
    "a fake object",
    OBJECT_KEYS,
    "objects is required: a YAML list of {objectName, secretPath}",
)


@dataclass(frozen=True)
class FakeStore:
    audience: str

    def describe(self) -> str:
        return "fake"


@hashed_once
@dataclass(frozen=True)
class FakeRef:
    path: str

    def describe(self) -> str:
        return self.path


@hashed_once
@dataclass(frozen=True)
class FakeSelection:
    """Every secret whose path starts with `prefix` (a `select` entry), at most `limit`."""

    prefix: str
    limit: int

    def describe(self) -> str:
        return f"{self.prefix}*"


#: What a fake object or selector reads.
Ref = FakeRef | FakeSelection

#: The one store instance of the fake store, as its change feed names it (tests).
SCOPE = "fake"


def subject(store: FakeStore, ref: Ref) -> Subject:
    """A fake path as a change record names it; a selector by its prefix."""
    if isinstance(ref, FakeSelection):
        return Subject.of(SCOPE, ref.prefix, prefix=True)
    return Subject.of(SCOPE, ref.path)


def parse(params: Mapping[str, str], ctx: ParseContext[Options]) -> StorePlan[FakeStore, Ref]:
    problems = Problems(strict=ctx.strict)

    def entry(obj: Mapping[str, Any], where: str) -> ObjectSpec[Ref]:
        name = expect_str(obj.get("objectName"), f"{where}.objectName", problems, required=True)
        path = expect_str(obj.get("secretPath"), f"{where}.secretPath", problems) or name
        return file_object(obj, where, name, FakeRef(path), problems)

    specs = parse_objects(params.get("objects", ""), OBJECTS, entry, ctx, problems)
    problems.raise_if_any()
    store = FakeStore(audience=params.get("audience", ""))
    return StorePlan("fake", store, tuple(specs), tuple(problems.warnings))


def selection(
    entry: Mapping[str, Any], store: FakeStore, limit: int, where: str, problems: Problems
) -> FakeSelection | None:
    """A `select` entry: `prefix` (required; "" is refused: a selector names what it takes)."""
    prefix = expect_str(entry.get("prefix"), f"{where}.prefix", problems, required=True)
    return FakeSelection(prefix, limit) if prefix else None


def audiences(store: FakeStore) -> tuple[str, ...]:
    """The audience of the pod token a mount of this class needs (`check --json`)."""
    return (store.audience,) if store.audience else ()


def lifetime(ref: Ref) -> tuple[str, str] | None:
    """Unknown to `check`: the fake store's leases come from its file, which `check` does not
    read (docs/fake-store.md)."""
    return None


#: The object entries of a class of several stores, as this dialect's `objects`.
listed = OBJECTS.listed
