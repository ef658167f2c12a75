"""Files on the node that a SecretProviderClass names (CA bundles, client keys, cloud files).

Whoever writes a class may name any path: `/dev/zero` would be read forever, a FIFO would block
the open, a directory or a missing file would tell them what exists on the node. So a node file
is opened without blocking, used only when it is a regular file under `MAX_NODE_FILE` bytes,
and every failure — missing, unreadable, wrong type, too large, unusable content — gives the same
message, which names the field and the path only.
"""

from __future__ import annotations

import os
import stat

from provider.core.errors import InvalidParameters

#: Largest node file a class may name (a full system CA bundle is about 220 KiB).
MAX_NODE_FILE = 1024 * 1024


def unusable(
    field: str, path: str, limit: int = MAX_NODE_FILE, holding: str = ""
) -> InvalidParameters:
    """The one error for a node file, whatever the cause (existence and type stay unknown);
    `holding` says what the file must contain, the same words for every cause."""
    return InvalidParameters(
        f"{field} {path} cannot be used: not a readable regular file under {limit // 1024} KiB"
        + (f" holding {holding}" if holding else "")
    )


def read_node_file(path: str, field: str, limit: int = MAX_NODE_FILE, holding: str = "") -> bytes:
    """The contents of a regular file of at most `limit` bytes, or `unusable`."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (OSError, ValueError):
        raise unusable(field, path, limit, holding) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise unusable(field, path, limit, holding)
        data = os.read(fd, limit + 1)
        if len(data) > limit:  # grew since fstat
            raise unusable(field, path, limit, holding)
        return data
    except OSError:
        raise unusable(field, path, limit, holding) from None
    finally:
        os.close(fd)


def check_node_file(path: str, field: str, limit: int = MAX_NODE_FILE, holding: str = "") -> None:
    """Refuse a path that is not a regular file under `limit` bytes (before a library opens it)."""
    read_node_file(path, field, limit, holding)


def check_node_dir(path: str, field: str) -> None:
    """Refuse a path that is not a readable directory, with one message whatever the cause."""
    try:
        info = os.stat(path)
        ok = stat.S_ISDIR(info.st_mode) and os.access(path, os.R_OK | os.X_OK)
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise InvalidParameters(f"{field} {path} cannot be used: not a readable directory")
