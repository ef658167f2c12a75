"""The files of an answer, and the driver's rules for them (docs/architecture.md).

The driver rejects the whole answer when one path breaks a rule, so every path is checked here
first and refused with a message naming the object. `check` applies the same rules offline.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

MAX_PATH_BYTES = 4096
MAX_ELEMENT_BYTES = 255


@dataclass(frozen=True)
class File:
    path: str
    mode: int
    contents: bytes = field(repr=False)


@dataclass(frozen=True)
class ObjectVersion:
    id: str
    version: str


def path_problem(path: str) -> str | None:
    """Why the driver would refuse `path` as a file path, or None when it is fine."""
    if path == "":
        return "the file path is empty"
    if "\0" in path:
        return "the file path contains a NUL byte"
    if path.startswith("/"):
        return f"the file path {path!r} is absolute; use a relative name"
    if len(path.encode()) > MAX_PATH_BYTES:
        return f"the file path is longer than {MAX_PATH_BYTES} bytes"
    elements = path.split("/")
    if any(e == ".." for e in elements):
        return f"the file path {path!r} contains a '..' element"
    if elements[0].startswith(".."):
        return f"the file path {path!r} starts with '..', which the driver reserves (..data)"
    if any(len(e.encode()) > MAX_ELEMENT_BYTES for e in elements):
        return f"a part of the file path is longer than {MAX_ELEMENT_BYTES} bytes"
    if path == "." or posixpath.normpath(path) != path:
        return f"the file path {path!r} is not in clean form (no './', '//' or trailing '/')"
    return None


def overlap_problems(paths: list[str]) -> list[str]:
    """Paths that collide: the same path twice, or a file used as another file's directory."""
    problems: list[str] = []
    seen: set[str] = set()
    for p in paths:
        if p in seen:
            problems.append(f"two files would be written to {p!r}")
        seen.add(p)
    for p in sorted(seen):
        parts = p.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in seen:
                problems.append(f"{parent!r} is a file but {p!r} needs it to be a directory")
    return problems
