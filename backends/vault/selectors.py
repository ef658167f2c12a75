"""A vault class's `select` entries: every KV secret under a path (docs/selectors.md).

    select: |
      - path: secret/app          # a KV path as `bao kv` writes it: the mount, then the folder
        recursive: true           # default false: the path's own secrets only
        depth: 5                  # with recursive: folder levels read below the path (1-10)
        directory: app            # files app/<key relative to the path>

The path is a KV path, not an API path: the mount (KV v1 or v2, found by asking the server,
as the `bao kv` commands do) adds `/metadata/` or `/data/` itself. Depth is bounded because each
level is one more round trip in sequence (the folders of a level are listed at once): a poll
of a recursive selector waits about depth + 2 calls, and a tree of a thousand nested folders
cannot chain a thousand. Five levels cover `team/env/app/component/name` below a selector; a
recursive selector that meets a folder deeper than its depth fails naming it rather than
leaving its secrets out.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provider.core.model import hashed_once
from provider.core.parsing import Problems, expect_str, parse_bool

SELECT_KEYS = frozenset({"path", "recursive", "depth"})
#: Folder levels below the path a recursive selector reads, unless it says `depth`.
DEFAULT_DEPTH = 5
MAX_DEPTH = 10
MAX_PATH = 1024
_UNSAFE = re.compile(r"[?#%\\\x00-\x1f\x7f]")


@hashed_once
@dataclass(frozen=True)
class VaultSelection:
    """Every KV secret under `path` (mount and folder, no leading or trailing '/'), down to
    `depth` folder levels below it (0: its own secrets only), at most `limit` secrets."""

    path: str
    depth: int
    limit: int
    recursive: bool = False

    def describe(self) -> str:
        if self.recursive:
            return f"KV {self.path}/** ({self.depth} levels down)"
        return f"KV {self.path}/*"


def selection(
    entry: Mapping[str, Any], store: object, limit: int, where: str, problems: Problems
) -> VaultSelection | None:
    """A `select` entry: `path` (required), `recursive`, `depth` (with recursive only)."""
    raw = expect_str(entry.get("path"), f"{where}.path", problems, required=True)
    path = _path(raw, f"{where}.path", problems) if raw else None
    recursive = parse_bool(entry.get("recursive"), f"{where}.recursive", problems)
    depth = 0
    if recursive:
        depth = _depth(entry.get("depth"), f"{where}.depth", problems)
    elif entry.get("depth") not in (None, ""):
        problems.add(f"{where}.depth: only a recursive selector has a depth; add recursive: true")
    if path is None:
        return None
    return VaultSelection(path, depth, limit, recursive)


def _path(raw: str, field: str, problems: Problems) -> str | None:
    path = raw.strip().removeprefix("/").removeprefix("v1/").strip("/")
    segments = path.split("/")
    if (
        not path
        or len(path) > MAX_PATH
        or _UNSAFE.search(path)
        or any(s in ("", ".", "..") for s in segments)
    ):
        problems.add(
            f"{field}: expected a KV path such as secret/app (the mount, then the folder; at "
            f"most {MAX_PATH} characters, without '?', '#', '%', a backslash, a control "
            f"character or an empty, '.' or '..' segment), got {urllib.parse.quote(raw[:80])!r}"
        )
        return None
    if len(segments) > 1 and segments[1] in ("data", "metadata"):
        problems.warn(
            f"{field} {path!r} reads like a KV version 2 API path: a selector takes the KV path "
            f"({segments[0]}/{'/'.join(segments[2:])}), and adds /data/ and /metadata/ itself; "
            "it is read as written"
        )
    return path


def _depth(value: Any, field: str, problems: Problems) -> int:
    if value in (None, ""):
        return DEFAULT_DEPTH
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_DEPTH:
        return value
    if isinstance(value, str) and value.strip().isdigit() and 1 <= int(value) <= MAX_DEPTH:
        return int(value)
    problems.add(
        f"{field}: expected the folder levels to read below the path, 1 to {MAX_DEPTH} "
        f"(default {DEFAULT_DEPTH}), got {str(value)[:40]!r}"
    )
    return DEFAULT_DEPTH
