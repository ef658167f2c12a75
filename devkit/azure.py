"""A local Microsoft Entra token endpoint and Key Vault, speaking the real REST wire.

One aiohttp HTTPS server answers for `login.microsoftonline.com` and `<vault>.vault.azure.net`
(routed by the Host header; the backend reaches it through --azure-connect-to and trusts its CA,
from `server_tls`, through --azure-ca-file). Key Vault calls follow the challenge flow: a request
without a bearer token gets 401 with `WWW-Authenticate: Bearer authorization=..., resource=...`;
every other call must carry a token this server issued, for the vault's tenant and resource, and
is answered per principal (the client id the token was issued to) from the vault's access list.

`GET /secrets` lists a vault's secrets as Key Vault does (selectors, backends/azure/listing.py):
`maxresults` (at most 25) a page, a `nextLink` to the next, each item its id without a version,
the current version's attributes, its tags and contentType, and `managed` for a certificate's
secret; a principal may list when its access is "*" or it is one of the vault's `listers`.
`list_forever` answers empty pages with a next link for ever; `next_link_host` sends the next
page elsewhere (hostile servers); `gone` objects are listed but not found when read.

With `signed_tokens`, Entra's access tokens are RS256 JWTs as Entra's v1 tokens are (`aud` the
scope's resource, `iss` https://sts.windows.net/<tenant>/, `tid`, `oid` (`object_id`), `appid`,
`nbf`/`exp`), signed with `token_key`, whose public half Entra's keys endpoint publishes
(`/<tenant>/discovery/keys`, named by the v1 discovery document `/<tenant>/.well-known/
openid-configuration`, as Vault's azure method reads it). `entra_app()` serves Entra alone, on
any host name (a test's `AZURE_AUTHORITY_HOST`).
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import ssl
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

from devkit import certs
from devkit.ports import serve_app

AUTHORITY = "login.microsoftonline.com"
SUFFIX = "vault.azure.net"
RESOURCE = f"https://{SUFFIX}"
_counter = itertools.count(1)


def server_tls(directory: Path, prefix: str = "") -> certs.ServerTLS:
    """A CA, and a certificate it issued for Entra and every vault (*.vault.azure.net)."""
    return certs.server_tls(directory, AUTHORITY, sans=[AUTHORITY, f"*.{SUFFIX}"], prefix=prefix)


@dataclass
class Version:
    version: str
    created: int
    enabled: bool
    #: The REST bundle without id/attributes (value/contentType/kid, key, cer, ...).
    body: dict[str, Any]


@dataclass
class Vault:
    name: str
    tenant: str
    #: principal (client id) -> readable (type, name) pairs; "*" for everything.
    access: dict[str, set[tuple[str, str]] | str] = field(default_factory=dict)
    objects: dict[tuple[str, str], list[Version]] = field(default_factory=dict)
    #: Principals that may list the vault's secrets beside those with "*" access.
    listers: set[str] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"https://{self.name}.{SUFFIX}"

    def add(self, kind: str, name: str, body: dict[str, Any], *, enabled: bool = True) -> str:
        """Add a version (newest); returns its 32-hex version id."""
        version = secrets.token_hex(16)
        self.objects.setdefault((kind, name), []).append(
            Version(version, 1_700_000_000 + next(_counter), enabled, body)
        )
        return version


@dataclass
class Calls:
    tokens: list[dict[str, str]] = field(default_factory=list)
    vault: list[tuple[str, str, str]] = field(default_factory=list)  # (vault, path, principal)
    #: The tenant of each token request, in the order of `tokens`.
    token_tenants: list[str] = field(default_factory=list)


class FakeAzure:
    def __init__(self) -> None:
        self.vaults: dict[str, Vault] = {}
        #: (tenant, client id) -> pod tokens accepted as its client assertion (federation).
        self.federated: dict[tuple[str, str], set[str]] = {}
        #: (tenant, client id) -> client secret (service principals).
        self.client_secrets: dict[tuple[str, str], str] = {}
        #: access token -> (tenant, principal, scope)
        self.issued: dict[str, tuple[str, str, str]] = {}
        #: (vault, kind, name) -> how many 429s to answer before serving it.
        self.throttle: dict[tuple[str, str, str], int] = {}
        self.retry_after = "1"
        #: The status the throttled answers carry (429, or a 5xx to simulate an outage).
        self.throttle_status = 429
        #: Objects answered 200 with a body that is not JSON (a broken proxy).
        self.garbage: set[tuple[str, str, str]] = set()
        #: Objects still listed but answered 404 when read (deleted between a listing and a read).
        self.gone: set[tuple[str, str, str]] = set()
        #: Lifetime of issued access tokens, seconds.
        self.expires_in = 3599
        #: When set, the token endpoint answers this status (an Entra outage).
        self.entra_status: int | None = None
        #: The resource the 401 challenge names (a wrong one must be refused by the SDK).
        self.resource = RESOURCE
        #: Hostile listings: empty pages with a next link for ever; the next page's host.
        self.list_forever = False
        self.next_link_host: str | None = None
        self.calls = Calls()
        #: Issue signed JWT access tokens (Entra's v1 shape) instead of opaque ones.
        self.signed_tokens = False
        self.token_key: rsa.RSAPrivateKey | None = None
        self.token_kid = "kid-" + secrets.token_hex(8)
        #: client id -> object (principal) id of its service principal; made on first use.
        self.object_ids: dict[str, str] = {}
        #: The claims of each signed token issued.
        self.token_claims: list[dict[str, Any]] = []

    def object_id(self, client: str) -> str:
        return self.object_ids.setdefault(client, str(uuid.uuid5(uuid.NAMESPACE_URL, client)))

    def signing_key(self) -> rsa.RSAPrivateKey:
        if self.token_key is None:
            self.token_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return self.token_key

    def signed_token(self, tenant: str, client: str, scope: str, **claims: Any) -> str:
        """An Entra v1 access token for the scope's resource, signed with `token_key`."""
        now = int(time.time())
        body: dict[str, Any] = {
            "aud": scope.removesuffix("/.default"),
            "iss": f"https://sts.windows.net/{tenant}/",
            "iat": now,
            "nbf": now,
            "exp": now + self.expires_in,
            "tid": tenant,
            "oid": self.object_id(client),
            "sub": self.object_id(client),
            "appid": client,
            "ver": "1.0",
            **claims,
        }
        self.token_claims.append(body)
        headers = {"kid": self.token_kid, "typ": "JWT"}
        return jwt.encode(body, self.signing_key(), algorithm="RS256", headers=headers)

    def entra_app(self) -> web.Application:
        """Entra alone, whatever the Host (a test's AZURE_AUTHORITY_HOST names it)."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._entra)
        return app

    def vault(self, name: str, tenant: str) -> Vault:
        self.vaults[name] = Vault(name, tenant)
        return self.vaults[name]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        host = request.host.split(":")[0]
        if host == AUTHORITY:
            return await self._entra(request)
        if host.endswith("." + SUFFIX):
            return self._vault(host.removesuffix("." + SUFFIX), request)
        return web.json_response({"error": f"unknown host {host}"}, status=421)

    # --- Microsoft Entra -------------------------------------------------------------------
    async def _entra(self, request: web.Request) -> web.StreamResponse:
        keys = self._entra_keys(request)
        if keys is not None:
            return keys
        m = re.fullmatch(r"/([^/]+)/v2\.0/\.well-known/openid-configuration", request.path)
        if m and request.method == "GET":
            base = f"https://{AUTHORITY}/{m.group(1)}"
            return web.json_response(
                {
                    "token_endpoint": f"{base}/oauth2/v2.0/token",
                    "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                    "issuer": f"{base}/v2.0",
                }
            )
        m = re.fullmatch(r"/([^/]+)/oauth2/v2\.0/token", request.path)
        if not m or request.method != "POST":
            return web.json_response({"error": "not_found"}, status=404)
        if self.entra_status is not None:
            return web.json_response({"error": "temporarily_unavailable"}, status=self.entra_status)
        tenant, form = m.group(1), dict(await request.post())
        self.calls.tokens.append({k: str(v) for k, v in form.items()})
        self.calls.token_tenants.append(tenant)
        client = str(form.get("client_id", ""))
        assertion, secret = form.get("client_assertion"), form.get("client_secret")
        if assertion is not None:
            ok = str(assertion) in self.federated.get((tenant, client), set())
            why = (
                "AADSTS700213: No matching federated identity record found for presented assertion."
            )
        else:
            ok = secret is not None and self.client_secrets.get((tenant, client)) == secret
            why = "AADSTS7000215: Invalid client secret provided."
        if form.get("grant_type") != "client_credentials" or not ok:
            return web.json_response(
                {"error": "invalid_client", "error_description": why, "error_codes": [700213]},
                status=401,
            )
        return self.token_answer(tenant, client, str(form.get("scope", "")))

    def token_answer(self, tenant: str, client: str, scope: str) -> web.Response:
        """Entra's answer to a login it accepted: an access token for `client` (also what the
        AKS token proxy of devkit/azure_binding.py relays)."""
        token = "at-" + secrets.token_urlsafe(16)
        if self.signed_tokens:
            token = self.signed_token(tenant, client, scope)
        self.issued[token] = (tenant, client, scope)
        return web.json_response(
            {
                "token_type": "Bearer",
                "expires_in": self.expires_in,
                "ext_expires_in": self.expires_in,
                "access_token": token,
            }
        )

    def _entra_keys(self, request: web.Request) -> web.Response | None:
        """The v1 discovery document and the signing keys (Vault's azure method reads them)."""
        if request.method != "GET":
            return None
        base = f"https://{request.host}"
        m = re.fullmatch(r"/([^/]+)/\.well-known/openid-configuration", request.path)
        if m:
            tenant = m.group(1)
            return web.json_response(
                {
                    "issuer": f"https://sts.windows.net/{tenant}/",
                    "jwks_uri": f"{base}/{tenant}/discovery/keys",
                    "token_endpoint": f"{base}/{tenant}/oauth2/token",
                    "id_token_signing_alg_values_supported": ["RS256"],
                }
            )
        if re.fullmatch(r"/[^/]+/discovery(?:/v2\.0)?/keys", request.path):
            public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.signing_key().public_key()))
            key = {**public, "kid": self.token_kid, "use": "sig", "alg": "RS256"}
            return web.json_response({"keys": [key]})
        return None

    # --- Key Vault -------------------------------------------------------------------------
    def _vault(self, name: str, request: web.Request) -> web.StreamResponse:
        vault = self.vaults.get(name)
        if vault is None:
            return web.json_response({"error": "no such vault"}, status=404)
        principal = self._principal(vault, request)
        if principal is None:
            authority = f"https://{AUTHORITY}/{vault.tenant}"
            challenge = f'Bearer authorization="{authority}", resource="{self.resource}"'
            return web.json_response(
                {
                    "error": {
                        "code": "Unauthorized",
                        "message": "AKV10000: Request is missing a Bearer",
                    }
                },
                status=401,
                headers={"WWW-Authenticate": challenge},
            )
        self.calls.vault.append((name, request.path, principal))
        if request.path.rstrip("/") == "/secrets" and request.method == "GET":
            return self._list(vault, principal, request)
        m = re.fullmatch(r"/(secrets|keys|certificates)/([^/]+)(?:/([^/]*))?/?", request.path)
        if not m or request.method != "GET":
            return _error(400, "BadParameter", "unsupported request")
        kind = {"secrets": "secret", "keys": "key", "certificates": "cert"}[m.group(1)]
        obj, version = m.group(2), m.group(3) or ""
        allowed = vault.access.get(principal)
        if allowed != "*" and (allowed is None or (kind, obj) not in allowed):
            return _error(
                403,
                "Forbidden",
                f"The user, group or application 'appid={principal}' does not have {kind}s get "
                f"permission on key vault '{name}'.",
            )
        if (name, kind, obj) in self.garbage:
            return web.Response(text="<html>proxy error</html>", content_type="application/json")
        remaining = self.throttle.get((name, kind, obj), 0)
        if remaining:
            self.throttle[(name, kind, obj)] = remaining - 1
            headers = {"Retry-After": self.retry_after}
            return _error(self.throttle_status, "Throttled", "Too many requests", headers)
        versions = vault.objects.get((kind, obj))
        if not versions or (name, kind, obj) in self.gone:
            return _error(
                404, f"{kind.title()}NotFound", f"A {kind} with (name/id) {obj} was not found"
            )
        if version == "versions":
            return web.json_response(
                {"value": [self._item(vault, kind, obj, v) for v in versions], "nextLink": None}
            )
        chosen = (
            versions[-1]
            if not version
            else next((v for v in versions if v.version == version), None)
        )
        if chosen is None:
            return _error(
                404,
                f"{kind.title()}NotFound",
                f"A {kind} with (name/id) {obj}/{version} was not found",
            )
        return web.json_response(
            {**self._item(vault, kind, obj, chosen), **_body(vault, kind, obj, chosen)}
        )

    def _list(self, vault: Vault, principal: str, request: web.Request) -> web.Response:
        """One page of Key Vault's Get Secrets: ids without versions, no values."""
        if vault.access.get(principal) != "*" and principal not in vault.listers:
            return _error(
                403,
                "Forbidden",
                f"The user, group or application 'appid={principal}' does not have secrets list "
                f"permission on key vault '{vault.name}'.",
            )
        try:
            size = min(25, max(1, int(request.query.get("maxresults", "25"))))
            start = int(request.query.get("$skiptoken", "0"))
        except ValueError:
            return _error(400, "BadParameter", "maxresults and $skiptoken are numbers")
        names = sorted(n for (kind, n), versions in vault.objects.items() if kind == "secret")
        page = [] if self.list_forever else names[start : start + size]
        items = []
        for secret in page:
            latest = vault.objects[("secret", secret)][-1]
            item = {
                "id": f"{vault.url}/secrets/{secret}",
                "attributes": {
                    "enabled": latest.enabled,
                    "created": latest.created,
                    "updated": latest.created,
                },
                "tags": latest.body.get("tags") or {},
            }
            if "contentType" in latest.body:
                item["contentType"] = latest.body["contentType"]
            if latest.body.get("certificate_backed"):
                item["managed"] = True
            items.append(item)
        more = self.list_forever or start + size < len(names)
        query = urlencode({"api-version": request.query.get("api-version", ""), "maxresults": size})
        base = f"https://{self.next_link_host}" if self.next_link_host else f"{vault.url}:443"
        following = f"{base}/secrets?{query}&$skiptoken={start + size}" if more else None
        return web.json_response({"value": items, "nextLink": following})

    def _principal(self, vault: Vault, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            return None
        issued = self.issued.get(auth.removeprefix("Bearer "))
        if issued is None or issued[0] != vault.tenant or issued[2] != RESOURCE + "/.default":
            return None
        return issued[1]

    def _item(self, vault: Vault, kind: str, name: str, v: Version) -> dict[str, Any]:
        path = {"secret": "secrets", "key": "keys", "cert": "certificates"}[kind]
        attributes = {"enabled": v.enabled, "created": v.created, "updated": v.created}
        ident = f"{vault.url}/{path}/{name}/{v.version}"
        if kind == "key":
            return {"kid": ident, "attributes": attributes}
        return {"id": ident, "attributes": attributes}


def _body(vault: Vault, kind: str, name: str, v: Version) -> dict[str, Any]:
    body = dict(v.body)
    if kind == "key":
        body["key"] = {**body["key"], "kid": f"{vault.url}/keys/{name}/{v.version}"}
    if body.pop("certificate_backed", False):
        body["kid"] = f"{vault.url}/keys/{name}/{v.version}"
        body["managed"] = True
    return body


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status, headers=headers
    )


async def start(fake: FakeAzure, context: ssl.SSLContext) -> tuple[web.AppRunner, int]:
    """Serve `fake` over HTTPS on 127.0.0.1; returns the runner and the port."""
    return await serve_app(fake.app(), ssl_context=context)
