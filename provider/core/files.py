"""The files of an answer, and the driver's rules for them (docs/architecture.md).

The driver rejects the whole answer when one path breaks a rule, so every path is checked here
first and refused with a message naming the object. `check` applies the same rules offline.

The driver also refuses an answer whose *serialized* MountResponse is over its gRPC receive
limit; `wire_size` is that size, computed from these dataclasses without building the protobuf
(the mount layer never imports the stubs; tests/mount/test_response_size.py checks it against
`SerializeToString`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_PATH_BYTES = 4096
MAX_ELEMENT_BYTES = 255
#: Characters of a path too long for the driver that its message shows.
SHOWN = 160
#: The driver's gRPC receive limit for a MountResponse unless its `--max-call-recv-msg-size`
#: says otherwise (gRPC-Go's default, 4 MiB); `--max-response-bytes` must not exceed it.
DRIVER_RECV_BYTES = 4 * 1024 * 1024


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
    try:
        path.encode()
    except UnicodeEncodeError:  # a lone surrogate (\ud800) from the attributes' JSON
        return "the file path is not valid UTF-8 (it holds a lone surrogate)"
    if len(path.encode()) > MAX_PATH_BYTES:
        return f"the file path {shown_path(path)} is longer than {MAX_PATH_BYTES} bytes"
    elements = path.split("/")
    if any(e == ".." for e in elements):
        return f"the file path {path!r} contains a '..' element"
    if elements[0].startswith(".."):
        return f"the file path {path!r} starts with '..', which the driver reserves (..data)"
    longest = max(len(e.encode()) for e in elements)
    if longest > MAX_ELEMENT_BYTES:
        return (
            f"a part of the file path {shown_path(path)} is longer than {MAX_ELEMENT_BYTES} bytes "
            f"({longest})"
        )
    if path == "." or posixpath.normpath(path) != path:
        return f"the file path {path!r} is not in clean form (no './', '//' or trailing '/')"
    return None


def shown_path(path: str) -> str:
    """`path` quoted, its middle left out past SHOWN characters: enough of its start and end to
    find the object or secret, within one line."""
    if len(path) <= SHOWN:
        return repr(path)
    return repr(path[: SHOWN - 40] + "…" + path[-40:])


def overlap_problems(paths: Sequence[str], origins: Sequence[str] | None = None) -> list[str]:
    """Paths that collide: the same path twice, or a file used as another file's directory;
    with `origins` (what wrote each path, in the same order), each problem names both."""
    problems: list[str] = []
    first: dict[str, int] = {}

    def both(a: int, b: int) -> str:
        return f" (by {origins[a]} and {origins[b]})" if origins is not None else ""

    for i, p in enumerate(paths):
        if p in first:
            problems.append(f"two files would be written to {p!r}{both(first[p], i)}")
        else:
            first[p] = i
    for p in sorted(first):
        parts = p.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in first:
                problems.append(
                    f"{parent!r} is a file but {p!r} needs it to be a directory"
                    f"{both(first[parent], first[p])}"
                )
    return problems


def wire_size(files: Sequence[File], versions: Sequence[ObjectVersion]) -> int:
    """The exact size in bytes of the serialized MountResponse{object_version, files} (no
    error set), as protobuf encodes it (protos/provider.proto): each element of a repeated
    message field is its tag byte, the varint of its length, then its fields; a field holding
    its default value (empty string or bytes, mode 0) is left out."""
    total = 0
    for v in versions:
        total += _delimited(_text(v.id) + _text(v.version))
    for f in files:
        contents = len(f.contents)
        body = _text(f.path) + (_delimited(contents) if contents else 0)
        if f.mode:
            # int32: a negative value is sign-extended to 64 bits, ten bytes as a varint.
            body += 1 + (_varint_size(f.mode) if f.mode > 0 else 10)
        total += _delimited(body)
    return total


def _text(value: str) -> int:
    """A string field (numbers 1-15): nothing when empty, else tag, length and UTF-8 bytes."""
    return _delimited(len(value.encode())) if value else 0


def _delimited(length: int) -> int:
    """A length-delimited field of numbers 1-15: one tag byte, the length's varint, the bytes."""
    return 1 + _varint_size(length) + length


def _varint_size(value: int) -> int:
    """Bytes of a non-negative varint: 7 bits each."""
    if value < 0x80:
        return 1
    if value < 0x4000:
        return 2
    return (value.bit_length() + 6) // 7
