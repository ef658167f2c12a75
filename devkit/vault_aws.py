"""Vault's aws auth method (iam type) in front of a real OpenBao, verified by a real moto STS.

OpenBao bundles no aws, gcp or azure auth method (`bao auth enable aws`: "plugin not found in
the catalog"), and Vault is not installable here. So this wire fake does what Vault's
builtin/credential/aws login does for the iam type, step by step, and hands everything else to
OpenBao:

    auth = VaultAwsAuth(openbao.addr, sts_endpoint=moto.url)   # Vault's `sts_endpoint`
    auth.add_role("app", bound_iam_principal_arn=role_arn, policies=["app"], iam=moto.url)
    await auth.start()        # auth.url: the class's vaultAddress
    auth.sts_calls            # [("GetCallerIdentity", 200)]: what STS answered each replay
    await auth.stop()

- the login's four iam fields are required; the method must be POST; the URL, body and
  headers are base64 (headers: Go's JSON http.Header, or a flat map);
- with `server_id` set (iam_server_id_header_value), the header must be present, equal, and
  among the SignedHeaders of the Authorization header;
- the signed request is replayed to `sts_endpoint` + the client URL's request URI, with the
  client URL's host as Host (which the signature covers), redirects not followed; a non-200
  answer refuses the login ("error making upstream request"); moto checks the SigV4 signature
  only in its auth mode, which cannot serve the unsigned AssumeRoleWithWebIdentity, so the
  replay runs with moto's auth on (`/moto-api/reset-auth`) and turns it off again;
- the caller's ARN is canonicalised (assumed-role -> role) and bound as Vault binds it: with
  resolve_aws_unique_ids (Vault's default) the bound role's unique id, read from IAM
  (`iam_endpoint`) when the role is written, must be the caller's UserId prefix; else the
  canonical ARN must be listed; a bound ARN ending in '*' is a glob (here on the canonical
  ARN; Vault globs the full ARN, path included, read from IAM);
- refusals are Vault's texts as HTTP 400; a success is a real OpenBao token with the role's
  policies (auth/token/create with the root token).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import fnmatch
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

from devkit.vault_standin import HOP, StandIn

SERVER_ID_HEADER = "X-Vault-AWS-IAM-Server-ID"
_STS_NS = "{https://sts.amazonaws.com/doc/2011-06-15/}"


@dataclass
class AwsRole:
    bound_iam_principal_arn: list[str]
    policies: list[str]
    #: The bound roles' unique ids (resolve_aws_unique_ids), read from IAM when written.
    principal_ids: list[str] = field(default_factory=list)
    ttl: str = "1h"


class VaultAwsAuth(StandIn):
    """Vault's aws auth method at `auth/<mount>/login`; every other path goes to OpenBao."""

    def __init__(
        self, upstream: str, *, sts_endpoint: str, mount: str = "aws", server_id: str = ""
    ) -> None:
        super().__init__(upstream, mount)
        self.sts_endpoint = sts_endpoint.rstrip("/")
        self.server_id = server_id
        self.roles: dict[str, AwsRole] = {}
        self.sts_calls: list[tuple[str, int]] = []
        self.logins: list[str] = []  # the canonical ARN of each login, refused or not
        self._replay = asyncio.Lock()

    def add_role(
        self,
        name: str,
        *,
        bound_iam_principal_arn: str,
        policies: list[str],
        iam: str = "",
        resolve_aws_unique_ids: bool = True,
    ) -> None:
        """Write a role (synchronously, before traffic); `iam`: Vault's iam_endpoint."""
        ids: list[str] = []
        if resolve_aws_unique_ids and not bound_iam_principal_arn.endswith("*"):
            ids.append(_role_id(iam, bound_iam_principal_arn))
        self.roles[name] = AwsRole([bound_iam_principal_arn], policies, ids)

    async def login(self, data: dict[str, Any]) -> web.Response:
        fields = ("iam_http_request_method", "iam_request_url", "iam_request_body")
        given = [f for f in (*fields, "iam_request_headers") if data.get(f)]
        if not given:
            return _refuse("didn't supply required authentication values")
        if len(given) < 4:
            return _refuse("supplied some of the auth values for the iam auth type but not all")
        if data["iam_http_request_method"] != "POST":
            return _refuse("invalid iam_http_request_method; currently only 'POST' is supported")
        try:
            url = base64.b64decode(data["iam_request_url"], validate=True).decode()
            body = base64.b64decode(data["iam_request_body"], validate=True).decode()
            headers = _headers(data["iam_request_headers"])
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return _refuse("failed to base64 decode the iam request")
        if self.server_id:
            problem = _server_id_problem(headers, self.server_id)
            if problem:
                return _refuse(f"error validating {SERVER_ID_HEADER} header: {problem}")
        status, answer = await self._replay_to_sts(url, body, headers)
        if status != 200:
            return _refuse(f"error making upstream request: received error code {status} from STS")
        arn, user_id = _caller(answer)
        canonical = _canonical(arn)
        self.logins.append(canonical)
        name = str(data.get("role") or canonical.rpartition("/")[2])
        role = self.roles.get(name)
        if role is None:
            return _refuse(f"entry for role {name} not found")
        if not _bound(role, canonical, user_id.split(":")[0]):
            return _refuse(f"IAM Principal {arn!r} does not belong to the role {name!r}")
        return await self._token(role, name, canonical)

    async def _replay_to_sts(
        self, url: str, body: str, headers: dict[str, list[str]]
    ) -> tuple[int, bytes]:
        parts = urlsplit(url)
        target = f"{self.sts_endpoint}/{(parts.path or '/').lstrip('/')}"
        if parts.query:
            target += "?" + parts.query
        sent = {k: ",".join(v) for k, v in headers.items() if k.lower() not in HOP}
        sent["Host"] = parts.netloc
        async with self._replay:
            await self._moto_auth("0")
            try:
                async with self.http.post(
                    target, data=body.encode(), headers=sent, allow_redirects=False
                ) as answer:
                    payload = await answer.read()
                    status = answer.status
            finally:
                await self._moto_auth("inf")
        self.sts_calls.append((parse_qs(body).get("Action", ["?"])[0], status))
        return status, payload

    async def _moto_auth(self, count: str) -> None:
        async with self.http.post(
            f"{self.sts_endpoint}/moto-api/reset-auth",
            data=count.encode(),
            headers={"Content-Type": "text/plain"},
        ) as answer:
            answer.raise_for_status()

    async def _token(self, role: AwsRole, name: str, canonical: str) -> web.Response:
        meta = {"canonical_arn": canonical, "auth_type": "iam"}
        return await self.mint(role.policies, name, meta, ttl=role.ttl)


def _refuse(message: str) -> web.Response:
    return web.json_response({"errors": [message]}, status=400)


def _headers(encoded: Any) -> dict[str, list[str]]:
    """Vault's TypeHeader: base64 JSON (or JSON) of name -> [values] or name -> value."""
    raw = encoded
    if isinstance(encoded, str):
        raw = json.loads(base64.b64decode(encoded, validate=True))
    if not isinstance(raw, dict):
        raise ValueError("headers")
    return {str(k): [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in raw.items()}


def _server_id_problem(headers: dict[str, list[str]], required: str) -> str:
    wanted = SERVER_ID_HEADER.lower()
    given = next((",".join(v) for k, v in headers.items() if k.lower() == wanted), "")
    if not given:
        return f"missing header {SERVER_ID_HEADER!r}"
    if given != required:
        return f"expected {required!r} but got {given!r}"
    authz = next((",".join(v) for k, v in headers.items() if k == "Authorization"), "")
    if not authz:
        return "missing Authorization header"
    signed = re.search(r"SignedHeaders=([^,]+)", authz)
    if not signed or SERVER_ID_HEADER.lower() not in signed.group(1).split(";"):
        return "vault header wasn't signed"
    return ""


def _caller(answer: bytes) -> tuple[str, str]:
    root = ET.fromstring(answer)
    result = root.find(f"{_STS_NS}GetCallerIdentityResult")
    assert result is not None, answer
    return result.findtext(f"{_STS_NS}Arn", ""), result.findtext(f"{_STS_NS}UserId", "")


def _canonical(arn: str) -> str:
    """Vault's parseIamArn + canonicalArn: assumed-role/<name>/<session> -> role/<name>."""
    parts = arn.split(":")
    kind, _, rest = parts[5].partition("/")
    name = rest.split("/")[0] if kind == "assumed-role" else rest.rpartition("/")[2]
    kind = "role" if kind == "assumed-role" else kind
    return f"arn:{parts[1]}:iam::{parts[4]}:{kind}/{name}"


def _bound(role: AwsRole, canonical: str, unique_id: str) -> bool:
    if unique_id in role.principal_ids:
        return True
    if not role.principal_ids and canonical in role.bound_iam_principal_arn:
        return True
    return any(
        bound.endswith("*") and fnmatch.fnmatchcase(canonical, bound)
        for bound in role.bound_iam_principal_arn
    )


def _role_id(iam: str, role_arn: str) -> str:
    """The role's unique id from IAM GetRole, as Vault resolves a bound ARN when it is written."""
    import boto3  # with moto (test extras); synchronous, before any traffic

    client = boto3.client(
        "iam",
        region_name="us-east-1",
        endpoint_url=iam,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    role_id: str = client.get_role(RoleName=role_arn.rpartition("/")[2])["Role"]["RoleId"]
    return role_id
