"""Taking the driver's socket, and giving it back, without harming another provider.

Before anything is bound, the path is checked: made absolute (a relative `--socket` is resolved
against the working directory), short enough for a Unix socket, in a directory that exists (only
the driver's default directory is created: a mistyped one is refused, not served in) and that
this process may create a socket in (tried with a real bind of the private name `_bind` uses).
Each problem is one StartupError line naming the path and the fix.

During a surge rollout (or a manual `serve` on a node) a second process may start on the same
`--socket`. Removing whatever is there and binding anew would take the socket from a provider
that still serves — and its shutdown would then delete the newcomer's socket too. So before
binding we dial what is there: a provider that answers keeps its socket and we refuse to start;
a socket nobody answers on is stale and removed. On shutdown we remove the socket only if it is
still the one this process created (same inode).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
from dataclasses import dataclass

from provider.core.settings import DEFAULT_SOCKET
from provider.edge.server import call_version

log = logging.getLogger("secrets_bridge.startup")

#: The driver's provider directory (its `--provider-volume`), which the chart mounts from the
#: node: the one directory `serve` creates when it is missing.
DEFAULT_DIRECTORY = os.path.dirname(DEFAULT_SOCKET)
#: sun_path holds 108 bytes on Linux, the last one the terminating NUL.
UNIX_PATH_MAX = 107
#: `serve` binds `.NAME.PID` beside the socket first (see `private_name`): 2 bytes more than
#: the path, and the process id, at most 7 digits (Linux's pid_max is at most 2**22).
PRIVATE_EXTRA = 2 + 7
#: The longest `--socket` serve accepts, whatever its process id.
SOCKET_PATH_MAX = UNIX_PATH_MAX - PRIVATE_EXTRA


class StartupError(Exception):
    """A reason `serve` cannot start, as one line for the operator. `exit_code` follows the
    CLI's rule: 2 when the command line alone is wrong, 1 when the node refuses it."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.exit_code = 2 if usage else 1


@dataclass
class Claim:
    """What `claim_socket` did on the way: a directory it created is removed again (if still
    empty) when the start is abandoned, so a refused start leaves nothing behind."""

    path: str
    created_directory: str | None = None
    #: serve started: what the claim made stays (the socket is given back by `release_socket`).
    kept: bool = False

    def keep(self) -> None:
        self.kept = True

    def release(self) -> None:
        """At the end of serve: abandon the claim, unless serve started (`keep`)."""
        if not self.kept:
            self.abandon()

    def abandon(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(private_name(self.path))
        if self.created_directory is not None:
            try:
                os.rmdir(self.created_directory)
            except OSError as exc:
                # Expected: it is gone, or no longer empty (someone else uses it now).
                if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
                    log.warning(
                        "could not remove the directory created for the socket",
                        extra={
                            "fields": {
                                "directory": self.created_directory,
                                "error": exc.strerror or type(exc).__name__,
                            }
                        },
                    )


def absolute(path: str) -> str:
    """`--socket` as serve binds it: absolute (resolved against the working directory)."""
    return os.path.abspath(path)


def private_name(path: str) -> str:
    """The name gRPC binds beside `path` before it is renamed into place (app._bind)."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}")


def check_length(path: str) -> None:
    """Refuse a path a Unix socket cannot have (a usage error: the path alone decides)."""
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_MAX:
        raise StartupError(
            f"--socket {path}: {size} bytes is too long for a Unix socket path (serve accepts "
            f"at most {SOCKET_PATH_MAX}: the kernel's {UNIX_PATH_MAX}, less the {PRIVATE_EXTRA} "
            "of the temporary name it binds first); choose a shorter path",
            usage=True,
        )


async def claim_socket(path: str) -> Claim:
    """Make absolute `path` free to bind: check its directory and that a socket can be created
    there, refuse if a provider answers at `path`, remove a stale socket."""
    check_length(path)
    claim = Claim(path, _directory(path))
    try:
        _try_bind(path)
        await _take_over(path)
    except BaseException:
        claim.abandon()
        raise
    return claim


def _directory(path: str) -> str | None:
    """Check the socket's directory; create it only when it is the driver's default one.
    Returns the directory created, if any."""
    directory = os.path.dirname(path)
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        pass
    except NotADirectoryError:
        raise StartupError(
            f"--socket {path}: {_file_above(directory)} is a file, not a directory; choose a "
            "socket path in a directory"
        ) from None
    except OSError as exc:
        raise StartupError(
            f"--socket {path}: cannot look into {directory} ({_reason(exc, directory)}); "
            "run serve as a user that may enter it, or choose another --socket"
        ) from None
    else:
        if not stat.S_ISDIR(st.st_mode):
            raise StartupError(
                f"--socket {path}: {directory} is a file, not a directory; choose a socket "
                "path in a directory"
            )
        return None
    if os.path.normpath(directory) != os.path.normpath(DEFAULT_DIRECTORY):
        raise StartupError(
            f"--socket {path}: the directory {directory} does not exist; create it, or correct "
            f"the path (serve creates only the driver's directory, {DEFAULT_DIRECTORY})"
        )
    try:
        os.mkdir(directory, 0o755)
    except FileExistsError:
        return None
    except OSError as exc:
        raise StartupError(
            f"--socket {path}: {directory} does not exist and cannot be created "
            f"({_reason(exc, os.path.dirname(directory))}); mount the driver's provider directory "
            f"from the node there{_as_root_hint()}, as deploy/base/daemonset.yaml does, or "
            "choose another --socket"
        ) from None
    return directory


def _file_above(directory: str) -> str:
    """The nearest ancestor of `directory` that exists (a file, when stat said ENOTDIR)."""
    while directory not in ("", os.sep) and not os.path.lexists(directory):
        directory = os.path.dirname(directory)
    return directory


def _try_bind(path: str) -> None:
    """Bind and remove the private name, as gRPC will bind it: the one reliable test that a
    socket can be created in the directory (permissions, capabilities, a read-only mount),
    made here so that its failure is one line instead of gRPC's traceback."""
    private = private_name(path)
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.lstat(private).st_mode):
            os.unlink(private)  # left by a process with our pid that died (gRPC does the same)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.bind(private)
    except OSError as exc:
        directory = os.path.dirname(path)
        if exc.errno in (errno.EACCES, errno.EPERM):
            fix = _may_not_write_fix()
        elif exc.errno == errno.EROFS:
            fix = "mount a writable directory there (the driver's, from the node), or "
        else:
            fix = ""
        raise StartupError(
            f"--socket {path}: cannot create a socket in {directory} "
            f"({_reason(exc, directory)}); {fix}choose another --socket"
        ) from None
    finally:
        probe.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(private)


def _reason(exc: OSError, directory: str) -> str:
    """The error, and for a refusal who may write `directory` and who this process is."""
    text = (exc.strerror or str(exc)).lower()
    if exc.errno not in (errno.EACCES, errno.EPERM):
        return text
    who = f"this process runs as uid {os.geteuid()}{_root_without_override()}"
    try:
        st = os.stat(directory)
    except OSError:
        return f"{text}; {who}"
    return (
        f"{text}: it belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}, and {who}"
    )


#: CAP_DAC_OVERRIDE's bit in /proc/self/status CapEff: what lets root write whatever the mode.
_CAP_DAC_OVERRIDE = 1 << 1


def _dac_override() -> bool | None:
    """Whether this process may write whatever a file's mode says (None: cannot tell)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & _CAP_DAC_OVERRIDE)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _root_without_override() -> str:
    # Root without the capability is held to the directory's mode like any other user: saying
    # "run as uid 0" to it would contradict what it already is.
    if os.geteuid() == 0 and _dac_override() is False:
        return " without CAP_DAC_OVERRIDE, so the directory's mode applies to it as to any user"
    return ""


def _may_not_write_fix() -> str:
    """What to do when the directory refuses this process a socket (EACCES, EPERM)."""
    if os.geteuid() != 0:
        return "run serve as a user that may write there (the DaemonSet runs it as uid 0), or "
    if _dac_override() is False:
        return "make the directory writable by uid 0 (chown or chmod it on the node), or "
    # Root that may override modes was refused all the same: not the mode.
    return (
        "a security module (SELinux, AppArmor) refuses it: allow the container to write there, or "
    )


def _as_root_hint() -> str:
    """The mkdir case's fix: `run serve as uid 0`, unless it already is."""
    return "" if os.geteuid() == 0 else " and run serve as uid 0"


async def _take_over(path: str) -> None:
    """Refuse if a provider answers at `path`; remove a stale socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = (
            "a directory"
            if stat.S_ISDIR(st.st_mode)
            else "a symbolic link"
            if stat.S_ISLNK(st.st_mode)
            else "a file"
        )
        raise StartupError(
            f"--socket {path}: the path exists and is not a socket ({kind}); remove it or "
            "choose another --socket"
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


def connect_error(path: str) -> OSError | None:
    """Why connecting to the socket at `path` fails, or None when a process accepts there (a
    refused connect answers at once, unlike a gRPC dial, which waits out its timeout)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError as exc:
            return exc
    return None


def _listening(path: str) -> bool:
    return connect_error(path) is None


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
