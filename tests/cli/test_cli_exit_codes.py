"""The exit-status rule, held against the real CLI: 2 when the command line itself is wrong, 1
when it is right but the node refuses it (a path, a socket, a port, a file) or the command
failed. Every case ends in one line on stderr that names the path (or flag) and the fix, no
traceback and no gRPC noise, and leaves nothing behind: no socket, no private `.NAME.PID`
name, no directory, no audit line — in the working directory, beside the path or at /.

One row per case, each through the console script in a subprocess, as an operator meets it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket as pysocket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devkit.ports import free_port
from provider.cli.main import EXIT_STATUS
from provider.edge.startup import DEFAULT_DIRECTORY, SOCKET_PATH_MAX

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = shutil.which("secrets-bridge", path=str(ROOT / ".venv" / "bin")) or "secrets-bridge"
DATA = Path(__file__).parent / "data"
SPC = str(DATA / "fake-spc.yaml")
STORE = str(DATA / "fake-store.yaml")


@dataclass
class Node:
    """A case's world: `tmp` is the working directory; sockets opened here stay open (and
    listening, where asked) while the command runs."""

    tmp: Path
    held: contextlib.ExitStack
    port: str = ""

    def key(self) -> str:
        path = self.tmp / "hmac.key"
        path.write_bytes(b"k" * 32)
        return str(path)

    def serve(self, *argv: str) -> list[str]:
        """`serve` with a key (no random-key warning) and a free health port."""
        return ["serve", "--hmac-key-file", self.key(), *argv] + (
            [] if "--health-addr" in argv else ["--health-addr", f"127.0.0.1:{free_port()}"]
        )

    def bound(self, path: Path, *, listening: bool) -> str:
        """A Unix socket at `path`: a provider's (listening) or a stale one (nobody accepts)."""
        sock = self.held.enter_context(pysocket.socket(pysocket.AF_UNIX))
        sock.bind(str(path))
        if listening:
            sock.listen()
        return str(path)

    def busy_port(self) -> str:
        sock = self.held.enter_context(pysocket.socket())
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        self.port = f"127.0.0.1:{sock.getsockname()[1]}"
        return self.port

    def broken_store(self, text: str = "secrets:\n  a: [1\n") -> str:
        path = self.tmp / "store.yaml"
        if not path.exists():
            path.write_text(text)
        return str(path)

    def long_path(self, size: int) -> str:
        base = str(self.tmp) + "/"
        return base + "s" * (size - len(base) - 5) + ".sock"

    def locked_directory(self) -> str:
        """A directory this process may not create a socket in (another uid's, as the driver's
        root-owned one is to the image's uid 65532)."""
        path = self.tmp / "locked"
        path.mkdir()
        if os.geteuid() == 0:
            os.chown(path, 65532, 65532)  # root runs the command without capabilities
        else:
            path.chmod(0o555)
        return str(path)


Build = Callable[[Node], list[str]]
Expect = Callable[[Node], str]


@dataclass(frozen=True)
class Case:
    name: str
    argv: Build
    code: int
    line: Expect
    #: Run without capabilities when root (a root with CAP_DAC_OVERRIDE writes anywhere).
    unprivileged: bool = False
    #: The source checkout on the path (the dev kit the bench's rigs come from).
    checkout: bool = False
    #: How the line is held: "line" (all of it), "start" (argparse's own wording may vary
    #: between Python versions), "stdout" (a command that reports there, such as check).
    match: str = "line"


def _sock(n: Node, name: str = "p.sock") -> str:
    return str(n.tmp / name)


CASES = [
    # -- the command line itself: exit 2 -------------------------------------------------------
    Case(
        "unknown command",
        lambda n: ["sevre"],
        2,
        lambda n: "secrets-bridge: error: argument COMMAND: invalid choice: 'sevre'",
        match="start",
    ),
    Case(
        "serve: unknown flag",
        lambda n: n.serve("--socket", _sock(n), "--cach-ttl", "5"),
        2,
        lambda n: (
            "secrets-bridge serve: error: unrecognized arguments: --cach-ttl 5 (did you "
            "mean --cache-ttl?); see secrets-bridge serve --help"
        ),
    ),
    Case(
        "serve: an abbreviation is not a flag",
        lambda n: ["serve", "--socket", _sock(n), "--hmac-key", n.key()],
        2,
        lambda n: (
            f"secrets-bridge serve: error: unrecognized arguments: --hmac-key {n.key()} "
            "(did you mean --hmac-key-file?); see secrets-bridge serve --help"
        ),
    ),
    Case(
        "serve: bad value",
        lambda n: n.serve("--socket", _sock(n), "--cache-ttl", "-5"),
        2,
        lambda n: (
            "secrets-bridge serve: error: argument --cache-ttl: expected a number of "
            "seconds at least 0, got '-5'; see secrets-bridge serve --help"
        ),
    ),
    Case(
        "serve: fake backend without its store file",
        lambda n: n.serve("--socket", _sock(n), "--enable-fake-backend"),
        2,
        lambda n: (
            "secrets-bridge serve: error: --enable-fake-backend needs --fake-store-file "
            "FILE (the fake store serves only the secrets that file lists, docs/fake-store.md); "
            "without it every mount would fail; see secrets-bridge serve --help"
        ),
    ),
    Case(
        "serve: audit log without a key",
        lambda n: ["serve", "--socket", _sock(n), "--audit-log", str(n.tmp / "a.log")],
        2,
        lambda n: (
            "secrets-bridge serve: error: --audit-log needs --hmac-key-file: the trail's "
            "lines are sealed with the installation key, so that `secrets-bridge audit verify` can "
            "check them"
        ),
    ),
    Case(
        "serve: socket path too long",
        lambda n: n.serve("--socket", n.long_path(SOCKET_PATH_MAX + 1)),
        2,
        lambda n: (
            f"secrets-bridge serve: --socket {n.long_path(SOCKET_PATH_MAX + 1)}: "
            f"{SOCKET_PATH_MAX + 1} bytes is too long for a Unix socket path (serve accepts "
            f"at most {SOCKET_PATH_MAX}: the kernel's 107, less the 9 of the temporary name it "
            "binds first); choose a shorter path"
        ),
    ),
    Case(
        "mount: unknown flag",
        lambda n: ["mount", SPC, "--target", str(n.tmp / "v"), "--provider-sock", "x"],
        2,
        lambda n: (
            "secrets-bridge mount: error: unrecognized arguments: --provider-sock x (did "
            "you mean --provider-socket?); see secrets-bridge mount --help"
        ),
    ),
    Case(
        "mount: bad --permission",
        lambda n: ["mount", SPC, "--target", str(n.tmp / "v"), "--permission", "rw"],
        2,
        lambda n: (
            "secrets-bridge mount: error: --permission rw: expected an octal file mode "
            "such as 0644; see secrets-bridge mount --help"
        ),
    ),
    Case(
        "mount: fake backend without its store file",
        lambda n: ["mount", SPC, "--target", str(n.tmp / "v"), "--enable-fake-backend"],
        2,
        lambda n: (
            "secrets-bridge mount: error: --enable-fake-backend needs --fake-store-file "
            "FILE (the fake store serves only the secrets that file lists, docs/fake-store.md); "
            "without it every mount would fail; see secrets-bridge mount --help"
        ),
    ),
    Case(
        "mount: provider socket path too long",
        lambda n: [
            "mount",
            SPC,
            "--target",
            str(n.tmp / "v"),
            "--provider-socket",
            n.long_path(110),
        ],
        2,
        lambda n: (
            f"secrets-bridge mount: --provider-socket {n.long_path(110)}: 110 bytes is too "
            "long for a Unix socket path (at most 107); name it through a shorter path, such as a "
            "symlink to its directory"
        ),
    ),
    Case(
        "bench: unknown store",
        lambda n: ["bench", "--store", "vault", "--no-progress"],
        2,
        lambda n: (
            "secrets-bridge bench: error: argument --store: expected fake, openbao, moto or "
            "several comma-separated, got 'vault'; see secrets-bridge bench --help"
        ),
    ),
    Case(
        "bench: a socket without a class",
        lambda n: ["bench", "--socket", _sock(n), "--no-progress"],
        2,
        lambda n: (
            "secrets-bridge bench: error: --socket needs at least one --class SPC.yaml; "
            "see secrets-bridge bench --help"
        ),
    ),
    Case(
        "bench: socket path too long",
        lambda n: ["bench", "--socket", n.long_path(110), "--class", SPC, "--no-progress"],
        2,
        lambda n: (
            f"secrets-bridge bench: --socket {n.long_path(110)}: 110 bytes is too long for "
            "a Unix socket path (at most 107); name it through a shorter path, such as a "
            "symlink to its directory"
        ),
    ),
    Case(
        "audit verify: a file it cannot read (its 1 is kept for a broken chain)",
        lambda n: ["audit", "verify", str(n.tmp / "none.log"), "--hmac-key-file", n.key()],
        2,
        lambda n: f"secrets-bridge audit verify: {n.tmp / 'none.log'}: No such file or directory",
    ),
    # -- the node refuses: exit 1 --------------------------------------------------------------
    Case(
        "serve: a mistyped socket directory is not created",
        lambda n: n.serve("--socket", str(n.tmp / "typo" / "p.sock")),
        1,
        lambda n: (
            f"secrets-bridge serve: --socket {n.tmp}/typo/p.sock: the directory "
            f"{n.tmp}/typo does not exist; create it, or correct the path (serve creates only the "
            f"driver's directory, {DEFAULT_DIRECTORY})"
        ),
    ),
    Case(
        "serve: the socket's parent is a file",
        lambda n: n.serve("--socket", n.key() + "/p.sock"),
        1,
        lambda n: (
            f"secrets-bridge serve: --socket {n.key()}/p.sock: {n.key()} is a file, not a "
            "directory; choose a socket path in a directory"
        ),
    ),
    Case(
        "serve: the socket path is a directory",
        lambda n: n.serve("--socket", str(n.tmp)),
        1,
        lambda n: (
            f"secrets-bridge serve: --socket {n.tmp}: the path exists and is not a socket "
            "(a directory); remove it or choose another --socket"
        ),
    ),
    Case(
        "serve: a directory it may not write (the image's uid against the driver's directory)",
        lambda n: n.serve("--socket", n.locked_directory() + "/p.sock"),
        1,
        lambda n: (
            f"secrets-bridge serve: --socket {n.tmp}/locked/p.sock: cannot create a socket in "
            f"{n.tmp}/locked (permission denied: it belongs to uid "
            f"{65532 if os.geteuid() == 0 else os.geteuid()} with mode "
            f"{755 if os.geteuid() == 0 else 555}, and this process runs as uid {os.geteuid()}"
            + (
                " without CAP_DAC_OVERRIDE, so the directory's mode applies to it as to any "
                "user); make the directory writable by uid 0 (chown or chmod it on the node), or "
                if os.geteuid() == 0
                else "); run serve as a user that may write there (the DaemonSet runs it as "
                "uid 0), or "
            )
            + "choose another --socket"
        ),
        unprivileged=True,
    ),
    Case(
        "serve: another provider listens on the socket",
        lambda n: n.serve("--socket", n.bound(n.tmp / "p.sock", listening=True)),
        1,
        lambda n: (
            f"secrets-bridge serve: --socket {n.tmp}/p.sock: another provider (not "
            "answering Version) is serving there; stop it first, or choose another --socket"
        ),
    ),
    Case(
        "serve: health port in use",
        lambda n: n.serve("--socket", _sock(n), "--health-addr", n.busy_port()),
        1,
        lambda n: (
            f"secrets-bridge serve: --health-addr {n.port}: cannot listen (address already in "
            "use); stop what listens there, or choose another --health-addr"
        ),
    ),
    Case(
        "serve: the audit log's directory is missing",
        lambda n: n.serve("--socket", _sock(n), "--audit-log", str(n.tmp / "no" / "a.log")),
        1,
        lambda n: (
            f"secrets-bridge serve: --audit-log {n.tmp}/no/a.log: cannot write it (No such "
            f"file or directory); create the directory {n.tmp}/no, or choose another --audit-log "
            "(- is stderr)"
        ),
    ),
    Case(
        "serve: the key file cannot be read",
        lambda n: ["serve", "--socket", _sock(n), "--hmac-key-file", str(n.tmp / "no.key")],
        1,
        lambda n: (
            f"secrets-bridge serve: error: --hmac-key-file {n.tmp}/no.key: cannot read it "
            "(No such file or directory); create it with `openssl rand -base64 48`"
        ),
    ),
    Case(
        "serve: the fake store's file is missing",
        lambda n: n.serve(
            "--socket", _sock(n), "--enable-fake-backend", "--fake-store-file", "none.yaml"
        ),
        1,
        lambda n: (
            "secrets-bridge serve: error: --fake-store-file none.yaml: cannot read it (No such "
            "file or directory); create it (docs/fake-store.md shows its shape) or fix the path"
        ),
    ),
    Case(
        "serve: the fake store's file is not YAML",
        lambda n: n.serve(
            "--socket", _sock(n), "--enable-fake-backend", "--fake-store-file", n.broken_store()
        ),
        1,
        lambda n: (
            f"secrets-bridge serve: error: --fake-store-file {n.broken_store()}: not valid "
            "YAML: line 3, column 1: expected ',' or ']', but got '<stream end>'"
        ),
    ),
    Case(
        "mount: the fake store's file is not a map",
        lambda n: [
            "mount",
            SPC,
            "--target",
            "v",
            "--enable-fake-backend",
            "--fake-store-file",
            n.broken_store("- a\n"),
        ],
        1,
        lambda n: (
            f"secrets-bridge mount: error: --fake-store-file {n.tmp}/store.yaml: expected a "
            "YAML map (secrets:, and optionally access:, failures:, leases:), got a list"
        ),
    ),
    Case(
        "mount: nothing at the provider socket (relative)",
        lambda n: ["mount", SPC, "--target", "v", "--provider-socket", "p.sock"],
        1,
        lambda n: (
            f"secrets-bridge mount: --provider-socket p.sock ({n.tmp}/p.sock): nothing "
            f"there; start the provider (secrets-bridge serve --socket {n.tmp}/p.sock), or "
            "name the socket it serves on (on a node, "
            "/var/run/secrets-store-csi-providers/secrets-bridge.sock)"
        ),
    ),
    Case(
        "mount: the provider socket is a file",
        lambda n: ["mount", SPC, "--target", "v", "--provider-socket", SPC],
        1,
        lambda n: (
            f"secrets-bridge mount: --provider-socket {SPC}: not a socket (a file); name "
            "the socket the provider serves on"
        ),
    ),
    Case(
        "mount: nobody listens on the provider socket (relative)",
        lambda n: [
            "mount",
            SPC,
            "--target",
            "v",
            "--provider-socket",
            os.path.basename(n.bound(n.tmp / "stale.sock", listening=False)),
        ],
        1,
        lambda n: (
            f"secrets-bridge mount: --provider-socket stale.sock ({n.tmp}/stale.sock): "
            "nobody is listening there (the socket of a provider that stopped); start the "
            "provider, or name the socket of one that serves"
        ),
    ),
    Case(
        "mount: a token file it cannot read",
        lambda n: [
            "mount",
            SPC,
            "--target",
            "v",
            "--enable-fake-backend",
            "--fake-store-file",
            STORE,
            "--token",
            "vault=missing.jwt",
        ],
        1,
        lambda n: (
            "secrets-bridge mount: --token vault=missing.jwt: cannot read it (no such file "
            "or directory)"
        ),
    ),
    Case(
        "bench: nothing at the socket (relative)",
        lambda n: ["bench", "--socket", "p.sock", "--class", SPC, "--no-progress"],
        1,
        lambda n: (
            f"secrets-bridge bench: --socket p.sock ({n.tmp}/p.sock): nothing there; start "
            f"the provider (secrets-bridge serve --socket {n.tmp}/p.sock), or name the socket it "
            "serves on (on a node, /var/run/secrets-store-csi-providers/secrets-bridge.sock)"
        ),
    ),
    Case(
        "bench: nobody listens on the socket",
        lambda n: [
            "bench",
            "--socket",
            n.bound(n.tmp / "stale.sock", listening=False),
            "--class",
            SPC,
            "--no-progress",
        ],
        1,
        lambda n: (
            f"secrets-bridge bench: --socket {n.tmp}/stale.sock: nobody is listening "
            "there (the socket of a provider that stopped); start the provider, or name the socket "
            "of one that serves"
        ),
    ),
    Case(
        "bench: the rigs without the dev kit (an installed wheel)",
        lambda n: ["bench", "--store", "fake", "--no-progress"],
        1,
        lambda n: (
            "secrets-bridge bench: --store needs the dev kit: run `python -m "
            "provider.cli.main bench ...` at the root of a source checkout with the test extras "
            "installed; against a running provider use --socket"
        ),
    ),
    Case(
        "bench: the provider it starts refuses to start",
        lambda n: ["bench", "--store", "fake", "--provider-arg=--cach-ttl=1", "--no-progress"],
        1,
        lambda n: (
            "secrets-bridge bench: the provider the bench started: the server exited with "
            "2 before it was ready: secrets-bridge serve: error: unrecognized arguments: "
            "--cach-ttl=1 (did you mean --cache-ttl?); see secrets-bridge serve --help"
        ),
        checkout=True,
    ),
    Case(
        "check: a file it cannot read",
        lambda n: ["check", str(n.tmp / "none.yaml")],
        1,
        lambda n: f"{n.tmp}/none.yaml: error: cannot read the file (No such file or directory)",
        match="stdout",
    ),
]


@contextlib.contextmanager
def _unchanged(where: Path) -> Iterator[None]:
    """Nothing new in `where`, at / or in the driver's directory after the command."""
    before = {p for p in where.rglob("*")}
    root = set(os.listdir("/"))
    default = os.path.lexists(DEFAULT_DIRECTORY)
    yield
    assert {p for p in where.rglob("*")} - before == set(), "left behind in the directory"
    assert set(os.listdir("/")) - root == set(), "left behind at /"
    assert os.path.lexists(DEFAULT_DIRECTORY) == default, f"{DEFAULT_DIRECTORY} created"


def _without_capabilities() -> list[str]:
    """A prefix that runs the command as root without capabilities (as the DaemonSet drops
    them): root then writes only where it owns the directory."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root, and no setpriv to drop capabilities with")
    return [setpriv, "--inh-caps=-all", "--bounding-set=-all", "--"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_case_exits_with_its_code_in_one_line_and_leaves_nothing(
    tmp_path: Path, case: Case
) -> None:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SECRETS_BRIDGE_") and k != "PYTHONPATH"
    }
    if case.checkout:
        clean["PYTHONPATH"] = str(ROOT)
    with contextlib.ExitStack() as held:
        node = Node(tmp_path, held)
        argv = case.argv(node)
        prefix = _without_capabilities() if case.unprivileged else []
        with _unchanged(tmp_path):
            result = subprocess.run(
                [*prefix, SCRIPT, *argv],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=tmp_path,
                env=clean,
            )
        expected = case.line(node)
    assert result.returncode == case.code, result.stderr
    assert "Traceback" not in result.stderr and "E0000" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    if case.match == "stdout":
        assert lines == [] and result.stdout.strip().splitlines() == [expected]
        return
    assert len(lines) == 1, lines
    if case.match == "start":
        assert lines[0].startswith(expected) and lines[0].endswith("; see secrets-bridge --help")
    else:
        assert lines[0] == expected


def test_help_states_the_rule() -> None:
    text = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, timeout=30).stdout
    assert EXIT_STATUS.strip() in text
    assert "1  the command line is right, but the node refused it" in text
    assert "2  the command line (or a SECRETS_BRIDGE_* variable) is wrong" in text
