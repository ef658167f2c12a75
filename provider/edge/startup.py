"""Taking the driver's socket, and giving it back, without harming another provider.

During a surge rollout (or a manual `serve` on a node) a second process may start on the same
`--socket`. Removing whatever is there and binding anew would take the socket from a provider
that still serves — and its shutdown would then delete the newcomer's socket too. So before
binding we dial what is there: a provider that answers keeps its socket and we refuse to start;
a socket nobody answers on is stale and removed. On shutdown we remove the socket only if it is
still the one this process created (same inode).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat

from provider.edge.server import call_version


class StartupError(Exception):
    """A reason `serve` cannot start, as one line for the operator."""


async def claim_socket(path: str) -> None:
    """Make `path` free to bind: refuse if a provider answers there, remove a stale socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path) or "."
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"--socket {path}: cannot create {parent}: {exc.strerror}") from None
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise StartupError(
            f"--socket {path}: the path exists and is not a socket; remove it or choose another"
        )
    if not _listening(path):
        # A stale socket from a process that died (or was SIGKILLed): nobody listens on it.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    try:
        version = await call_version(path, seconds=2.0)
    except Exception:
        version = "not answering Version"
    raise StartupError(
        f"--socket {path}: another provider ({version}) is serving there; stop it first, or "
        "choose another --socket"
    )


def _listening(path: str) -> bool:
    """Whether a process accepts connections on the socket (a refused connect answers at once,
    unlike a gRPC dial, which would wait out its timeout on a stale socket)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def socket_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the socket at `path`, to recognise our own at shutdown."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def release_socket(path: str, ours: tuple[int, int] | None) -> None:
    """Remove `path` only if it is still the socket this process bound."""
    if ours is not None and socket_identity(path) == ours:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
