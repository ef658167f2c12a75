"""What every stand-in of a Vault cloud auth method shares (devkit/vault_aws.py, vault_gcp.py,
vault_azure.py): OpenBao ships none of them, so each serves `auth/<mount>/login` itself, checks
what Vault's plugin checks, mints a real OpenBao token, and forwards every other path to the
real OpenBao."""

from __future__ import annotations

from typing import Any

from aiohttp import ClientSession, web

from devkit.openbao_admin import ROOT_TOKEN
from devkit.ports import serve_app

#: Hop-by-hop headers a forwarded request or answer leaves behind.
HOP = ("host", "content-length", "transfer-encoding", "connection")


class Refused(Exception):
    """Vault's error text for a refused login."""


class StandIn:
    """A Vault auth method at `auth/<mount>/login`; every other path goes to OpenBao."""

    def __init__(self, upstream: str, mount: str) -> None:
        self.upstream = upstream
        self.mount = mount
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._http: ClientSession | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post(f"/v1/auth/{self.mount}/login", self._login)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner, port = await serve_app(app)
        self._http = ClientSession(auto_decompress=False)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def http(self) -> ClientSession:
        assert self._http is not None, "start() first"
        return self._http

    async def _login(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            return await self.login(data if isinstance(data, dict) else {})
        except Refused as refused:
            return web.json_response({"errors": [str(refused)]}, status=400)

    async def login(self, data: dict[str, Any]) -> web.Response:
        raise NotImplementedError

    async def mint(
        self, policies: list[str], name: str, meta: dict[str, str], ttl: str = "1h"
    ) -> web.Response:
        """A real OpenBao token with the role's policies, as the login's answer."""
        create = {
            "policies": policies,
            "ttl": ttl,
            "no_parent": True,
            "display_name": f"{self.mount}-{name}",
            "meta": {"role": name, **meta},
        }
        async with self.http.post(
            f"{self.upstream}/v1/auth/token/create",
            json=create,
            headers={"X-Vault-Token": ROOT_TOKEN},
        ) as answer:
            payload = await answer.json()
        return web.json_response({"auth": payload["auth"]})

    async def _forward(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with self.http.request(
            request.method,
            self.upstream + request.path_qs,
            data=await request.read(),
            headers=headers,
            allow_redirects=False,
        ) as upstream:
            payload = await upstream.read()
            keep = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP}
            return web.Response(status=upstream.status, body=payload, headers=keep)
