"""A real PostgreSQL server on loopback, for OpenBao's database secrets engine under test.

    db = PostgreSQL.start(workdir)           # initdb, free loopback port, waits for a query
    server.configure_database("database", db) # devkit.openbao_admin: OpenBao connects to it
    db.roles()                               # {"postgres", "v-root-app-..."}: the login roles
    db.can_login(user, password)             # a dynamic user really works (or no longer does)
    db.stop()                                # and its data directory is gone

Dynamic secrets are only worth testing against the database that honours them: the user a lease
creates must exist and log in, and revoking the lease must drop it. A stub would only echo our
own assumptions, so the harness runs the PostgreSQL installed on the machine:
- `initdb`, `postgres` and `psql` come from PATH, else the newest /usr/lib/postgresql/*/bin;
  none there raises FileNotFoundError (the tests need a real server, they never skip);
- the server listens on 127.0.0.1 only, on a free port, with no Unix socket, and every client
  (OpenBao's postgresql-database-plugin, our psql) logs in over TCP with a password
  (scram-sha-256); the superuser `admin_user` has a fresh random password per server;
- durability is off (fsync, synchronous_commit, full_page_writes): a throwaway cluster starts in
  about a second;
- postgres refuses to run as root. Run as root, initdb and the server run as the `postgres`
  system user, and the data directory lives in its own temp dir under /tmp (owned by that
  user), because pytest's tmp_path sits under a 0700 root directory the postgres user cannot
  enter; `stop()` removes it. The server log is always `workdir/postgres.log`;
- psql runs with the caller's environment minus every PG* variable, so a developer's shell
  (PGHOST, PGUSER, PGSERVICE, a ~/.pgpass via HOME) never picks the server it talks to.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devkit.ports import PortTaken, free_port, port_taken, retrying

#: The OS user the server runs as when we are root (postgres refuses root).
SYSTEM_USER = "postgres"
ADMIN_USER = "postgres"
DATABASE = "postgres"
#: Where Debian/Ubuntu install each major version (`<version>/bin`); searched when not on PATH.
PG_LIB = Path("/usr/lib/postgresql")
#: psql's separators in `query`: ASCII unit and record separators, never in test data.
_FIELD_SEP = "\x1f"
_RECORD_SEP = "\x1e"


@dataclass(frozen=True)
class Binaries:
    initdb: Path
    postgres: Path
    psql: Path


def find_binaries() -> Binaries:
    """initdb and postgres from the directory `initdb` on PATH resolves to, else from the newest
    /usr/lib/postgresql/*/bin; psql from that same directory when it has one, else from PATH."""
    bin_dir = _bin_dir()
    psql = bin_dir / "psql"
    if not psql.exists():
        found = shutil.which("psql")
        if found is None:
            raise FileNotFoundError(f"PostgreSQL client not found: no psql in {bin_dir} or on PATH")
        psql = Path(found)
    return Binaries(initdb=bin_dir / "initdb", postgres=bin_dir / "postgres", psql=psql)


def _bin_dir() -> Path:
    on_path = shutil.which("initdb")
    if on_path:
        bin_dir = Path(on_path).resolve().parent  # /usr/local/bin/initdb is often a symlink
        if (bin_dir / "postgres").exists():
            return bin_dir
    candidates = [
        d for d in PG_LIB.glob("*/bin") if (d / "initdb").exists() and (d / "postgres").exists()
    ]
    if not candidates:
        raise FileNotFoundError(
            f"PostgreSQL not found: no initdb/postgres on PATH or in {PG_LIB}/*/bin"
        )
    return max(candidates, key=lambda d: _version_key(d.parent.name))


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name)) or (-1,)


@dataclass
class PostgreSQL:
    """One `postgres` process on 127.0.0.1 with a password-protected superuser."""

    process: subprocess.Popen[bytes]
    port: int
    admin_password: str
    data_dir: Path
    log_path: Path
    binaries: Binaries
    admin_user: str = ADMIN_USER
    #: A temp dir of our own (when run as root) that `stop()` removes.
    _owned_dir: Path | None = None

    @property
    def connection_url(self) -> str:
        """The URL OpenBao's postgresql-database-plugin is configured with (it fills in the
        username and password it is given)."""
        return (
            f"postgresql://{{{{username}}}}:{{{{password}}}}@127.0.0.1:{self.port}/{DATABASE}"
            "?sslmode=disable"
        )

    @classmethod
    def start(cls, workdir: Path, *, timeout: float = 30.0) -> PostgreSQL:
        return retrying(lambda: cls._start_once(workdir, timeout))

    @classmethod
    def _start_once(cls, workdir: Path, timeout: float) -> PostgreSQL:
        binaries = find_binaries()
        workdir.mkdir(parents=True, exist_ok=True)
        as_user = _run_as()
        owned: Path | None = None
        if as_user is None:
            base = Path(tempfile.mkdtemp(prefix="postgres-", dir=workdir))
        else:
            owned = base = Path(tempfile.mkdtemp(prefix="secrets-bridge-pg-"))
            os.chown(base, as_user.pw_uid, as_user.pw_gid)
        try:
            password = secrets.token_urlsafe(18)
            pwfile = base / "pwfile"
            pwfile.write_text(password + "\n")
            if as_user is not None:
                os.chown(pwfile, as_user.pw_uid, as_user.pw_gid)
            data_dir = base / "data"
            try:
                initdb = subprocess.run(
                    [
                        str(binaries.initdb),
                        f"--pgdata={data_dir}",
                        f"--username={ADMIN_USER}",
                        f"--pwfile={pwfile}",
                        "--auth-host=scram-sha-256",
                        "--auth-local=scram-sha-256",
                        "--encoding=UTF8",
                        "--no-locale",
                        "--no-sync",
                        "--no-instructions",
                    ],
                    capture_output=True,
                    cwd=base,
                    env=_server_env(base),
                    timeout=timeout,
                    **_user_kwargs(as_user),
                )
            finally:
                pwfile.unlink(missing_ok=True)
            if initdb.returncode != 0:
                raise RuntimeError(f"initdb failed: {initdb.stderr.decode()[-2000:]}")
            port = free_port()
            log = workdir / "postgres.log"
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    [
                        str(binaries.postgres),
                        "-D",
                        str(data_dir),
                        "-p",
                        str(port),
                        "-c",
                        "listen_addresses=127.0.0.1",
                        "-c",
                        "unix_socket_directories=",
                        "-c",
                        "fsync=off",
                        "-c",
                        "synchronous_commit=off",
                        "-c",
                        "full_page_writes=off",
                        "-c",
                        "max_connections=50",
                        "-c",
                        "shared_buffers=16MB",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=base,
                    env=_server_env(base),
                    **_user_kwargs(as_user),
                )
        except BaseException:
            if owned is not None:
                shutil.rmtree(owned, ignore_errors=True)
            raise
        server = cls(process, port, password, data_dir, log, binaries, _owned_dir=owned)
        server._wait_ready(timeout)
        return server

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                output = self.log_path.read_text()
                error = PortTaken if port_taken(output) else RuntimeError
                raise error(f"postgres exited: {output[-2000:]}")
            if self.can_login(self.admin_user, self.admin_password):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"postgres did not become ready: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            # SIGINT is the "fast" shutdown: it ends open sessions (OpenBao's plugin keeps a
            # pool) where SIGTERM's "smart" one would wait for every client to leave.
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None

    # -- client ------------------------------------------------------------------------------

    def _psql(self, user: str, password: str, sql: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(PGPASSWORD=password, PGCONNECT_TIMEOUT="5", PGSSLMODE="disable")
        return subprocess.run(
            [
                str(self.binaries.psql),
                "--no-psqlrc",
                "--no-align",
                "--tuples-only",
                "--quiet",
                "--no-password",
                f"--field-separator={_FIELD_SEP}",
                f"--record-separator={_RECORD_SEP}",
                "--set=ON_ERROR_STOP=1",
                "--host=127.0.0.1",
                f"--port={self.port}",
                f"--username={user}",
                f"--dbname={DATABASE}",
                f"--command={sql}",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )

    def query(self, sql: str) -> list[tuple[str, ...]]:
        """Run `sql` as the superuser; the rows of its last statement, every value as text
        (NULL as ""). Raises RuntimeError with psql's message when it fails."""
        result = self._psql(self.admin_user, self.admin_password, sql)
        if result.returncode != 0:
            raise RuntimeError(f"psql failed ({result.returncode}): {result.stderr.strip()}")
        if not result.stdout:  # no rows (or no result set); one row of "" prints "\n"
            return []
        out = result.stdout.removesuffix("\n")
        return [tuple(record.split(_FIELD_SEP)) for record in out.split(_RECORD_SEP)]

    def roles(self) -> set[str]:
        """The roles that may log in (pg_roles.rolcanlogin), the superuser included."""
        return {row[0] for row in self.query("SELECT rolname FROM pg_roles WHERE rolcanlogin")}

    def can_login(self, user: str, password: str) -> bool:
        """Whether `user` logs in with `password` over TCP and can run `select 1`."""
        result = self._psql(user, password, "SELECT 1")
        return result.returncode == 0 and result.stdout.strip() == "1"


def _run_as() -> pwd.struct_passwd | None:
    """The system user to run initdb and the server as: `postgres` when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise FileNotFoundError(
            f"running as root, and postgres refuses root: no `{SYSTEM_USER}` system user"
        ) from None


def _user_kwargs(user: pwd.struct_passwd | None) -> dict[str, Any]:
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _server_env(base: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["HOME"] = str(base)
    return env


@contextlib.contextmanager
def running(workdir: Path) -> Iterator[PostgreSQL]:
    server = PostgreSQL.start(workdir)
    try:
        yield server
    finally:
        server.stop()


__all__ = ["PostgreSQL", "find_binaries", "running"]
