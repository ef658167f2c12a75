"""Conversions of Key Vault material into the files the Azure provider writes.

- `cert`: the certificate's DER (`cer`) as one PEM block.
- `key`: the public half of the JSON Web Key as a PKIX PEM (RSA and EC; HSM kinds alike).
- `secret` of a PFX-stored certificate: the private key as PKCS#8 PEM, then the certificates
  ordered leaf → intermediate → root, so TLS servers that read "key then chain" accept the file.
  A PFX does not promise any order, and Key Vault's own output has been seen root-first.
"""

from __future__ import annotations

import base64
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import pkcs12

_CURVES: dict[str, ec.EllipticCurve] = {
    "P-256": ec.SECP256R1(),
    "P-384": ec.SECP384R1(),
    "P-521": ec.SECP521R1(),
    "P-256K": ec.SECP256K1(),
}


class ConversionError(ValueError):
    """Material from the store that cannot be converted; the message names what, not the bytes."""


def cert_pem(der: bytes) -> bytes:
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        raise ConversionError("the certificate's DER content cannot be parsed") from None
    return cert.public_bytes(serialization.Encoding.PEM)


def public_key_pem(jwk: Any) -> bytes:
    """The PEM public key of an SDK `JsonWebKey` (attributes kty, n, e, crv, x, y as bytes)."""
    kty = _text(jwk.kty)
    public: rsa.RSAPublicKey | ec.EllipticCurvePublicKey
    if kty.startswith("RSA"):
        if not jwk.n or not jwk.e:
            raise ConversionError("the RSA key has no modulus or exponent")
        numbers = rsa.RSAPublicNumbers(_int(jwk.e), _int(jwk.n))
        public = numbers.public_key()
    elif kty.startswith("EC"):
        curve = _CURVES.get(_text(jwk.crv))
        if curve is None or not jwk.x or not jwk.y:
            raise ConversionError(f"the EC key's curve {jwk.crv!s} is not supported")
        public = ec.EllipticCurvePublicNumbers(_int(jwk.x), _int(jwk.y), curve).public_key()
    else:
        raise ConversionError(f"key type {kty or 'unknown'} has no public key to write")
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def pfx_to_pem(value: str) -> bytes:
    """A base64 PFX (as Key Vault stores it, no password) as key PEM + ordered chain PEM."""
    try:
        key, leaf, extra = pkcs12.load_key_and_certificates(base64.b64decode(value), None)
    except ValueError:
        raise ConversionError("the certificate's PFX content cannot be parsed") from None
    out = b""
    if key is not None:
        out += key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    certs = ([leaf] if leaf is not None else []) + list(extra)
    for cert in order_chain(certs):
        out += cert.public_bytes(serialization.Encoding.PEM)
    return out


def order_chain(certs: list[x509.Certificate]) -> list[x509.Certificate]:
    """Leaf first, then each certificate's issuer; certificates off the chain keep their order."""
    if not certs:
        return []
    issuers = {c.issuer for c in certs if c.issuer != c.subject}
    # The leaf issued nothing in the bundle; prefer the PFX's own certificate (listed first).
    leaf = next((c for c in certs if c.subject not in issuers), certs[0])
    ordered, remaining = [leaf], [c for c in certs if c is not leaf]
    while remaining:
        current = ordered[-1]
        if current.issuer == current.subject:
            break
        parent = next((c for c in remaining if c.subject == current.issuer), None)
        if parent is None:
            break
        ordered.append(parent)
        remaining.remove(parent)
    return ordered + remaining


def _text(value: Any) -> str:
    # The SDK's KeyType/KeyCurveName are str enums: their str() is the member name, not the value.
    return str(getattr(value, "value", value) or "")


def _int(raw: bytes) -> int:
    return int.from_bytes(raw, "big")
