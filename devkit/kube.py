"""Stand-ins for the Kubernetes API: the three calls the stores' auth paths make of it.

    key = SigningKey.generate()              # devkit.tokens: the service-account token signer
    TokenReviewStub(key)                     # /apis/authentication.k8s.io/v1/tokenreviews
    await TokenRequestStub(key).start()      # .../serviceaccounts/<sa>/token (TokenRequest)
    await ServiceAccounts({("default", "app"): {"eks.amazonaws.com/role-arn": "arn:..."}}).start()
                                             # GET .../serviceaccounts/<sa> (annotations)

All listen on 127.0.0.1 and verify or mint tokens with the same key. The TokenReview stub runs
in a thread, not on an event loop: OpenBao (another process) calls it during a login that a test
may be awaiting, and a session-wide fixture outlives each test's loop.
"""

from __future__ import annotations

import collections
import http.server
import json
import threading
from typing import Any

import jwt
from aiohttp import web

from devkit.ports import serve_app
from devkit.tokens import SigningKey


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
        self._runner, port = await serve_app(app)
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


class ServiceAccounts:
    """GET /api/v1/namespaces/{ns}/serviceaccounts/{name}, with the given annotations;
    `calls` counts reads by "namespace/name"."""

    def __init__(self, accounts: dict[tuple[str, str], dict[str, str]]) -> None:
        self.accounts = accounts
        self.calls: collections.Counter[str] = collections.Counter()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/serviceaccounts/{name}", self._get)
        self._runner, port = await serve_app(app)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def _get(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        self.calls[f"{ns}/{name}"] += 1
        if (ns, name) not in self.accounts:
            return web.json_response(
                {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404},
                status=404,
            )
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": ns, "annotations": self.accounts[(ns, name)]},
        }
        return web.json_response(body)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
