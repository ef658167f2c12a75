"""Test PKI: a CA for the fake server's TLS, and real certificate chains for Key Vault objects."""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from tests.backends.azure.fake_azure import b64url

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
    key: Key | None = None,
) -> Issued:
    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(s) for s in sans]), critical=False
        )
    cert = builder.sign((issuer or Issued(key, None)).key, hashes.SHA256())  # type: ignore[arg-type]
    return Issued(key, cert)


def chain() -> tuple[Issued, Issued, Issued]:
    """root -> intermediate -> leaf (the leaf an RSA key, as most TLS certificates)."""
    root = issue("test root", ca=True)
    intermediate = issue("test intermediate", root, ca=True)
    leaf = issue("app.example.com", intermediate, key=rsa.generate_private_key(65537, 2048))
    return root, intermediate, leaf


def jwk(key: Key) -> dict[str, Any]:
    public = key.public_key()
    if isinstance(public, rsa.RSAPublicKey):
        n = public.public_numbers()
        return {"kty": "RSA", "key_ops": ["verify"], "n": b64url(_raw(n.n)), "e": b64url(_raw(n.e))}
    assert isinstance(public, ec.EllipticCurvePublicKey)
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
    blob = pkcs12.serialize_key_and_certificates(
        b"cert", leaf.key, leaf.cert, [c.cert for c in extra], serialization.NoEncryption()
    )
    return base64.b64encode(blob).decode()


def cert_body(leaf: Issued) -> dict[str, Any]:
    der = leaf.cert.public_bytes(serialization.Encoding.DER)
    return {
        "cer": base64.b64encode(der).decode(),
        "x5t": b64url(leaf.cert.fingerprint(hashes.SHA1())),
    }
