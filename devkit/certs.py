"""One certificate builder for the whole harness: CAs, leaves, chains and TLS server files.

Every TLS test (OpenBao's TLS and mTLS listeners, the Google and Azure wire fakes, the
"untrusted server" end-to-end test) and the Key Vault certificate objects are built here, so all
of them carry the same extensions: SubjectKeyIdentifier everywhere, AuthorityKeyIdentifier on
issued certificates, KeyUsage on CAs (what strict verifiers — BoringSSL in gRPC, Python's
VERIFY_X509_STRICT — expect). Keys are P-256 unless a caller passes one.

    ca = issue("test CA", ca=True)
    leaf = issue("app.example.com", ca, sans=["app.example.com"], ips=["127.0.0.1"])
    tls = server_tls(tmp_path, "localhost", ips=["127.0.0.1"])   # files + an ssl context
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

Key = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


@dataclass
class Issued:
    key: Key
    cert: x509.Certificate

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


def issue(
    cn: str,
    issuer: Issued | None = None,
    *,
    ca: bool = False,
    sans: list[str] | None = None,
    ips: list[str] | None = None,
    key: Key | None = None,
    lifetime: dt.timedelta = dt.timedelta(days=1),
) -> Issued:
    """A certificate for `cn`, signed by `issuer` (self-signed without one)."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    signer = issuer.key if issuer else key
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), False
        )
    )
    if ca:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    names: list[x509.GeneralName] = [x509.DNSName(s) for s in sans or []]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips or []]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return Issued(key, builder.sign(signer, hashes.SHA256()))


def chain() -> tuple[Issued, Issued, Issued]:
    """root -> intermediate -> leaf (the leaf an RSA key, as most TLS certificates)."""
    root = issue("test root", ca=True)
    intermediate = issue("test intermediate", root, ca=True)
    leaf = issue("app.example.com", intermediate, key=rsa.generate_private_key(65537, 2048))
    return root, intermediate, leaf


@dataclass(frozen=True)
class ServerTLS:
    """A TLS server's files: the CA clients trust, the chain (leaf + CA) and the key."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    cert_pem: bytes
    key_pem: bytes

    def context(self) -> ssl.SSLContext:
        """A server-side context presenting the chain."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


def server_tls(
    directory: Path,
    cn: str,
    *,
    sans: list[str] | None = None,
    ips: list[str] | None = None,
    prefix: str = "",
) -> ServerTLS:
    """A throwaway CA and a server certificate it issued for `cn` (plus `sans`/`ips`), written
    to `directory` as <prefix>ca.pem, <prefix>server.pem (leaf then CA) and <prefix>server.key."""
    ca = issue(f"{cn} test CA", ca=True)
    leaf = issue(cn, ca, sans=sans if sans is not None else [cn], ips=ips)
    directory.mkdir(parents=True, exist_ok=True)
    ca_file = directory / f"{prefix}ca.pem"
    cert_file, key_file = directory / f"{prefix}server.pem", directory / f"{prefix}server.key"
    ca_file.write_bytes(ca.pem)
    cert_file.write_bytes(leaf.pem + ca.pem)
    key_file.write_bytes(leaf.key_pem)
    return ServerTLS(ca_file, cert_file, key_file, leaf.pem, leaf.key_pem)


# -- encodings of keys and certificates (JOSE, PKCS#12), as Key Vault serves them ---------------


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def jwk(key: Key) -> dict[str, Any]:
    """The public half of `key` as a JSON Web Key."""
    public = key.public_key()
    if isinstance(public, rsa.RSAPublicKey):
        n = public.public_numbers()
        return {"kty": "RSA", "key_ops": ["verify"], "n": b64url(_raw(n.n)), "e": b64url(_raw(n.e))}
    p = public.public_numbers()
    size = (public.curve.key_size + 7) // 8
    return {
        "kty": "EC",
        "crv": {"secp256r1": "P-256", "secp384r1": "P-384"}[public.curve.name],
        "x": b64url(p.x.to_bytes(size, "big")),
        "y": b64url(p.y.to_bytes(size, "big")),
    }


def _raw(n: int) -> bytes:
    return n.to_bytes((n.bit_length() + 7) // 8, "big")


def public_pem(key: Key) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def pfx(leaf: Issued, extra: list[Issued]) -> str:
    """Base64 PKCS#12 of the leaf's key and certificate, with `extra` as the chain."""
    blob = pkcs12.serialize_key_and_certificates(
        b"cert", leaf.key, leaf.cert, [c.cert for c in extra], serialization.NoEncryption()
    )
    return base64.b64encode(blob).decode()


def cert_body(leaf: Issued) -> dict[str, Any]:
    """The `cer` and `x5t` fields of a certificate bundle."""
    der = leaf.cert.public_bytes(serialization.Encoding.DER)
    return {
        "cer": base64.b64encode(der).decode(),
        "x5t": b64url(leaf.cert.fingerprint(hashes.SHA1())),
    }
