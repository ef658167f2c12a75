"""Small real HTTP servers playing the Kubernetes API and the EKS Pod Identity agent.

kube = KubeStub({("default", "app"): {"eks.amazonaws.com/role-arn": "arn:..."}})
await kube.start()     # kube.url -> CoreSettings.kube_api_url
agent = PodIdentityAgent(token="pod-token")
await agent.start()    # agent.url -> Options.pod_identity_endpoint
"""

from __future__ import annotations

import collections
import datetime as dt
from typing import Any

from aiohttp import web

from tests.backends.aws.moto import free_port


class _Server:
    def __init__(self) -> None:
        self.url = ""
        self.calls: collections.Counter[str] = collections.Counter()
        self._runner: web.AppRunner | None = None

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> str:
        app = web.Application()
        self.routes(app)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class KubeStub(_Server):
    """GET /api/v1/namespaces/{ns}/serviceaccounts/{name}, with the given annotations."""

    def __init__(self, accounts: dict[tuple[str, str], dict[str, str]]) -> None:
        super().__init__()
        self.accounts = accounts

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/namespaces/{ns}/serviceaccounts/{name}", self._get)

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


class PodIdentityAgent(_Server):
    """The agent's credentials endpoint: the pod token in Authorization, credentials back."""

    def __init__(self, token: str, lifetime: float = 3600.0) -> None:
        super().__init__()
        self.token = token
        self.lifetime = lifetime

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/credentials", self._get)

    async def _get(self, request: web.Request) -> web.Response:
        self.calls["credentials"] += 1
        if request.headers.get("Authorization") != self.token:
            return web.json_response(
                {"code": "AccessDeniedException", "message": "token rejected"}, status=400
            )
        expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.lifetime)
        return web.json_response(
            {
                "AccessKeyId": "ASIAPODIDENTITYTEST1",
                "SecretAccessKey": "pod-identity-secret",
                "Token": "pod-identity-session",
                "AccountId": "123456789012",
                "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            }
        )
