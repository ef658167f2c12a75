"""A real OpenBao dev server for tests, and the admin steps tests need against it.

Reusable by any test (backend, end-to-end, benchmarks):

    server = OpenBao.start(tmp_dir, tls=True)  # free loopback ports, audit log, waits for health
    keys = SigningKey.generate()
    server.configure_jwt_auth("jwt", keys.public_pem)
    server.add_jwt_role("jwt", "app", namespace="default", service_account="app",
                        policies=["read-all"])
    token = keys.pod_token("default", "app", audience="vault")
    server.audit_mark()
    ...                                        # traffic under test
    server.audit_counts()                      # {("update", "auth/jwt/login"): 1, ...}
    server.stop()

Admin calls go through hvac with the root token (hvac is synchronous; tests call it directly).
Every admin method takes `vault_namespace` for OpenBao namespaces ("" = the root namespace).
Service-account tokens and the Kubernetes API stand-ins are in `kubestubs.py`.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hvac
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

ROOT_TOKEN = "root"
#: The only name in the TLS listeners' certificate (not 127.0.0.1): clients must send it.
TLS_SERVER_NAME = "openbao.test"
REPO = Path(__file__).resolve().parents[3]
BAO = REPO / ".venv" / "bin" / "bao"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def self_signed_cert(common_name: str, *, ip: str | None = None) -> tuple[str, str]:
    """(certificate PEM, private key PEM) for `common_name` (and `ip`), self-signed, a CA too."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.DNSName(common_name)]
    if ip:
        names.append(x509.IPAddress(ipaddress.ip_address(ip)))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem


@dataclass
class OpenBao:
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

    @classmethod
    def start(cls, workdir: Path, *, tls: bool = False, timeout: float = 20.0) -> OpenBao:
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        audit = workdir / "audit.log"
        # Declarative audit: OpenBao refuses enabling audit devices through the API.
        hcl = f'audit "file" "counter" {{\n  options {{\n    file_path = "{audit}"\n  }}\n}}\n'
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
                raise RuntimeError(f"bao exited: {self.log_path.read_text()[-2000:]}")
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

    def seal(self) -> None:
        self.root().sys.seal()

    def unseal(self) -> None:
        # The dev server prints its single unseal key at start-up.
        for line in self.log_path.read_text().splitlines():
            if line.startswith("Unseal Key:"):
                self.root().sys.submit_unseal_key(line.split(":", 1)[1].strip())
                return
        raise RuntimeError("no unseal key in the dev server's output")

    def root(self, vault_namespace: str = "") -> hvac.Client:
        return hvac.Client(
            url=self.addr, token=ROOT_TOKEN, timeout=10, namespace=vault_namespace or None
        )

    # -- admin -------------------------------------------------------------------------------

    def create_namespace(self, name: str) -> None:
        listed = self.root().list("sys/namespaces") or {}
        if f"{name}/" not in listed.get("data", {}).get("keys", []):
            self.root().write(f"sys/namespaces/{name}")

    def enable_auth(self, method: str, mount: str, vault_namespace: str = "") -> None:
        client = self.root(vault_namespace)
        if f"{mount}/" not in client.sys.list_auth_methods()["data"]:
            client.sys.enable_auth_method(method, path=mount)

    def enable_kv(self, mount: str, version: int, vault_namespace: str = "") -> None:
        client = self.root(vault_namespace)
        if f"{mount}/" not in client.sys.list_mounted_secrets_engines()["data"]:
            client.sys.enable_secrets_engine("kv", path=mount, options={"version": str(version)})

    def enable_engine(self, engine: str, mount: str, vault_namespace: str = "") -> None:
        client = self.root(vault_namespace)
        if f"{mount}/" not in client.sys.list_mounted_secrets_engines()["data"]:
            client.sys.enable_secrets_engine(engine, path=mount)

    def put_policy(self, name: str, hcl: str, vault_namespace: str = "") -> None:
        self.root(vault_namespace).sys.create_or_update_policy(name, hcl)

    def configure_jwt_auth(self, mount: str, public_pem: str, vault_namespace: str = "") -> None:
        self.enable_auth("jwt", mount, vault_namespace)
        self.root(vault_namespace).write(
            f"auth/{mount}/config", jwt_validation_pubkeys=[public_pem]
        )

    def add_jwt_role(
        self,
        mount: str,
        role: str,
        *,
        namespace: str,
        service_account: str,
        policies: list[str],
        audience: str = "vault",
        ttl: str = "1h",
        vault_namespace: str = "",
    ) -> None:
        """A jwt role bound to one service account (`sub`) and one audience."""
        self.root(vault_namespace).write(
            f"auth/{mount}/role/{role}",
            role_type="jwt",
            bound_audiences=[audience],
            user_claim="sub",
            bound_subject=f"system:serviceaccount:{namespace}:{service_account}",
            token_policies=policies,
            token_ttl=ttl,
        )

    def configure_kubernetes_auth(
        self, mount: str, kubernetes_host: str, vault_namespace: str = ""
    ) -> None:
        self.enable_auth("kubernetes", mount, vault_namespace)
        # No reviewer JWT: OpenBao then reviews each login token with that token itself. The CA
        # is required by the API but unused over plain http to the stub.
        self.root(vault_namespace).write(
            f"auth/{mount}/config",
            kubernetes_host=kubernetes_host,
            kubernetes_ca_cert=self_signed_cert("kubernetes")[0],
            disable_local_ca_jwt=True,
        )

    def add_kubernetes_role(
        self,
        mount: str,
        role: str,
        *,
        namespace: str,
        service_account: str,
        policies: list[str],
        audience: str | None = None,
        ttl: str = "1h",
        vault_namespace: str = "",
    ) -> None:
        params: dict[str, Any] = {
            "bound_service_account_names": [service_account],
            "bound_service_account_namespaces": [namespace],
            "token_policies": policies,
            "token_ttl": ttl,
        }
        if audience:
            params["audience"] = audience
        self.root(vault_namespace).write(f"auth/{mount}/role/{role}", **params)

    def kv1_put(
        self, mount: str, path: str, data: dict[str, Any], vault_namespace: str = ""
    ) -> None:
        self.root(vault_namespace).secrets.kv.v1.create_or_update_secret(
            path, data, mount_point=mount
        )

    def kv2_put(
        self, mount: str, path: str, data: dict[str, Any], vault_namespace: str = ""
    ) -> int:
        """Write a new version; returns its number."""
        result = self.root(vault_namespace).secrets.kv.v2.create_or_update_secret(
            path, data, mount_point=mount
        )
        version: int = result["data"]["version"]
        return version

    # -- audit -------------------------------------------------------------------------------

    def audit_mark(self) -> None:
        """Count only what happens from now on."""
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
        """(operation, path) -> responses since `audit_mark()`; the root token's admin calls
        are left out by default, so counts show the client's own traffic."""
        counts: Counter[tuple[str, str]] = Counter()
        for entry in self.audit_entries():
            if exclude_root and (entry.get("auth") or {}).get("display_name") == "root":
                continue
            request = entry.get("request") or {}
            path = request.get("path", "")
            if request.get("namespace", {}).get("path"):
                path = request["namespace"]["path"] + path
            counts[(request.get("operation", ""), path)] += 1
        return counts


@contextlib.contextmanager
def running(workdir: Path, *, tls: bool = False) -> Iterator[OpenBao]:
    server = OpenBao.start(workdir, tls=tls)
    try:
        yield server
    finally:
        server.stop()


def _tls_listeners(workdir: Path) -> tuple[str, dict[str, Any]]:
    """HCL for a TLS and an mTLS listener on free ports, and the OpenBao fields describing them."""
    server_cert, server_key = self_signed_cert(TLS_SERVER_NAME)
    client_cert, client_key = self_signed_cert("secrets-bridge-client")
    files = {
        "server.pem": server_cert,
        "server-key.pem": server_key,
        "client.pem": client_cert,
        "client-key.pem": client_key,
    }
    for name, text in files.items():
        (workdir / name).write_text(text)
    tls_port, mtls_port = free_port(), free_port()
    common = (
        f'  tls_cert_file = "{workdir / "server.pem"}"\n'
        f'  tls_key_file = "{workdir / "server-key.pem"}"\n'
    )
    hcl = (
        f'listener "tcp" {{\n  address = "127.0.0.1:{tls_port}"\n{common}}}\n'
        f'listener "tcp" {{\n  address = "127.0.0.1:{mtls_port}"\n{common}'
        f'  tls_client_ca_file = "{workdir / "client.pem"}"\n'
        "  tls_require_and_verify_client_cert = true\n}\n"
    )
    return hcl, {
        "tls_addr": f"https://127.0.0.1:{tls_port}",
        "mtls_addr": f"https://127.0.0.1:{mtls_port}",
        "ca_file": workdir / "server.pem",
        "client_cert_file": workdir / "client.pem",
        "client_key_file": workdir / "client-key.pem",
    }
