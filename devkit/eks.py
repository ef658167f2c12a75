"""The EKS Pod Identity agent's credentials endpoint, on loopback.

    agent = PodIdentityAgent(token="pod-token")
    await agent.start()    # agent.url -> Options.pod_identity_endpoint

It answers credentials only for the pod token it was given (in Authorization, as the agent
expects it), with an expiry `lifetime` seconds away, so tests can watch renewal.
"""

from __future__ import annotations

import collections
import datetime as dt

from aiohttp import web

from devkit.ports import serve_app


class PodIdentityAgent:
    """The agent's credentials endpoint: the pod token in Authorization, credentials back."""

    def __init__(self, token: str, lifetime: float = 3600.0) -> None:
        self.token = token
        self.lifetime = lifetime
        self.calls: collections.Counter[str] = collections.Counter()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/credentials", self._get)
        self._runner, port = await serve_app(app)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

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

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
