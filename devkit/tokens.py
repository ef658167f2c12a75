"""The cluster's service-account token signer: projected pod tokens as the kubelet mints them.

One RSA key stands for the API server's signing key. OpenBao's jwt auth is configured with its
public half (`public_pem`); the TokenReview and TokenRequest stubs (`devkit.kube`) verify and mint
with it. Signing and verifying go through PyJWT (a test extra, like everything in the dev kit):
the stubs must check signature, expiry and not-before exactly as a real verifier would, and a
hand-written JWT encoder would need a hand-written verifier beside it.

    key = SigningKey.generate()
    key.pod_token("default", "app", "vault")   # RS256, sub system:serviceaccount:default:app
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

#: The kubelet's default lifetime of a projected token (expirationSeconds), seconds.
DEFAULT_LIFETIME = 3600


@dataclass
class SigningKey:
    """An RSA key standing in for the cluster's service-account token signer."""

    private: rsa.RSAPrivateKey
    issuer: str = "https://kubernetes.default.svc.cluster.local"

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(rsa.generate_private_key(public_exponent=65537, key_size=2048))

    @property
    def public_pem(self) -> str:
        return (
            self.private.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )

    def pod_token(
        self,
        namespace: str,
        service_account: str,
        audience: str = "vault",
        *,
        lifetime: int = DEFAULT_LIFETIME,
        pod: str | None = None,
    ) -> str:
        """A service-account token for `audience`: bound to `pod` (uid `uid-<pod>`, as
        devkit.testing's requests name it) as the kubelet's projected tokens are, or, without
        `pod`, to none, as `kubectl create token` and the sync controller mint them."""
        now = int(time.time())
        kubernetes: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": service_account, "uid": f"uid-{service_account}"},
        }
        if pod is not None:
            kubernetes["pod"] = {"name": pod, "uid": f"uid-{pod}"}
        claims = {
            "iss": self.issuer,
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "aud": [audience],
            "iat": now,
            "nbf": now,
            "exp": now + lifetime,
            "kubernetes.io": kubernetes,
        }
        return jwt.encode(claims, self.private, algorithm="RS256")

    def verify(self, token: str) -> dict[str, Any]:
        """Claims of a token this key signed (raises jwt.InvalidTokenError otherwise)."""
        claims: dict[str, Any] = jwt.decode(
            token,
            self.private.public_key(),
            algorithms=["RS256"],
            options={"verify_aud": False},
        )
        return claims
