"""Stand-ins for the cluster side of Vault's auth methods, reusable by any test.

    key = SigningKey.generate()              # the service-account token signer
    key.pod_token("default", "app", "vault") # a projected token as the kubelet mints it
    TokenReviewStub(key)                     # /apis/authentication.k8s.io/v1/tokenreviews
    await TokenRequestStub(key).start()      # .../serviceaccounts/<sa>/token (TokenRequest)

All listen on 127.0.0.1 on a free port and verify or mint tokens with the same key.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


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
        lifetime: int = 600,
        pod: str = "app-0",
    ) -> str:
        """A projected service-account token as the kubelet would mint it."""
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "aud": [audience],
            "iat": now,
            "nbf": now,
            "exp": now + lifetime,
            "kubernetes.io": {
                "namespace": namespace,
                "serviceaccount": {"name": service_account, "uid": f"uid-{service_account}"},
                "pod": {"name": pod, "uid": f"uid-{pod}"},
            },
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


class TokenReviewStub:
    """A Kubernetes API stand-in answering TokenReview for tokens signed by `key` (on 127.0.0.1).

    OpenBao's kubernetes auth method posts each login token to
    /apis/authentication.k8s.io/v1/tokenreviews; this answers as the API server would.
    `reviews` counts the reviews it served.
    """

    def __init__(self, key: SigningKey) -> None:
        self.key = key
        self.reviews = 0
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                review = json.loads(self.rfile.read(length) or b"{}")
                stub.reviews += 1
                body = json.dumps(stub.review(review)).encode()
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def review(self, request: dict[str, Any]) -> dict[str, Any]:
        spec = request.get("spec") or {}
        result: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": spec,
        }
        try:
            claims = self.key.verify(spec.get("token", ""))
        except jwt.InvalidTokenError as exc:
            result["status"] = {"authenticated": False, "error": f"invalid token: {exc}"}
            return result
        wanted = spec.get("audiences") or []
        audiences = claims.get("aud") or []
        if wanted and not set(wanted) & set(audiences):
            result["status"] = {"authenticated": False, "error": "token audiences are invalid"}
            return result
        sa = claims["kubernetes.io"]["serviceaccount"]
        result["status"] = {
            "authenticated": True,
            "user": {
                "username": claims["sub"],
                "uid": sa["uid"],
                "groups": ["system:serviceaccounts"],
            },
            "audiences": audiences,
        }
        return result

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class TokenRequestStub:
    """The Kubernetes API's TokenRequest endpoint, minting tokens with the test key."""

    def __init__(self, key: SigningKey) -> None:
        self.key = key
        self.requests: list[dict[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(
            "/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", self._token_request
        )
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def _token_request(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        ns, sa = request.match_info["ns"], request.match_info["sa"]
        (audience,) = body["spec"]["audiences"]
        token = self.key.pod_token(ns, sa, audience)
        return web.json_response(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "metadata": {"name": sa, "namespace": ns},
                "spec": body["spec"],
                "status": {"token": token, "expirationTimestamp": "2030-01-01T00:00:00Z"},
            },
            status=201,
        )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
