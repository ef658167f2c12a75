"""The HTTP token calls: STS token exchange, IAM impersonation, a service account key's grant.

STS (RFC 8693, form-encoded as google-auth sends it) trades the pod's Kubernetes token for a
federated access token; IAM credentials generateAccessToken trades that for a Google service
account's token; a nodePublishSecretRef key's signed assertion (keyfile.py) is traded at its
`token_uri`. All are plain HTTPS JSON APIs, called with aiohttp on one shared session, each
answer capped in bytes (`MAX_ANSWER`) and time (the Mount's deadline, at most `CALL_TIMEOUT`),
never following a redirect, and reported by status and known error code only (errors.py).
Each goes through the proxy the environment names for its URL (HTTPS_PROXY / HTTP_PROXY /
NO_PROXY, read when the backend is built; backends/wire.py `Proxies`).
"""

from __future__ import annotations

import datetime
import json
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from yarl import URL

from backends.gcp.dialect import Audience
from backends.gcp.errors import http_error, is_tls_failure, tls_error, translated
from backends.proxies import Proxies, proxied_requests
from backends.wire import MAX_SMALL_BODY, Resolver, read_capped
from provider.core.errors import StoreUnavailable
from provider.core.model import FetchContext

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
GSA_ANNOTATION = "iam.gke.io/gcp-service-account"
#: Upper bound of one token call; the Mount's deadline usually cuts it shorter.
CALL_TIMEOUT = 30.0
#: Cap of one token answer (a token response is under 4 KiB).
MAX_ANSWER = MAX_SMALL_BODY
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"


@dataclass(frozen=True)
class AccessToken:
    token: str = field(repr=False)
    #: time.monotonic() at which Google stops accepting it.
    expires: float


class TokenEndpoints:
    """STS and IAM credentials; the aiohttp session opens on first use (in the running loop)."""

    def __init__(self, sts_url: str, iam_url: str, ca_file: str | None = None) -> None:
        self._sts_url = sts_url
        self._iam_url = iam_url.rstrip("/")
        self._ca_file = ca_file
        self._session: aiohttp.ClientSession | None = None
        self._resolver: Resolver | None = None
        self._proxies = Proxies.from_env()

    async def exchange(
        self, audience: Audience, pod_token: str, subject: str, ctx: FetchContext
    ) -> AccessToken:
        form = {
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "audience": audience.sts,
            "scope": SCOPE,
            "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
            "subject_token": pod_token,
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        }
        what = f"the STS token exchange for {subject} (audience {audience.sts!r})"
        fix = (
            f"check that the pod's token is issued for audience {audience.token!r} and "
            "that the provider's --gcp-project/--gcp-location/--gcp-cluster name this cluster"
        )
        body = await self._post(self._sts_url, what, fix, ctx, subject, data=form)
        return _token(body, "access_token", what, expires_in="expires_in")

    async def impersonate(
        self,
        federated: AccessToken,
        gsa: str,
        delegates: list[str],
        subject: str,
        ctx: FetchContext,
    ) -> AccessToken:
        url = f"{self._iam_url}/v1/projects/-/serviceAccounts/{gsa}:generateAccessToken"
        what = f"IAM generateAccessToken for {gsa} as {subject}"
        fix = (
            f"grant roles/iam.workloadIdentityUser on {gsa} to the Kubernetes ServiceAccount "
            f"{subject} (annotation {GSA_ANNOTATION})"
        )
        payload: dict[str, Any] = {"scope": [SCOPE]}
        if delegates:
            payload["delegates"] = [f"projects/-/serviceAccounts/{d}" for d in delegates]
        headers = {"Authorization": f"Bearer {federated.token}"}
        body = await self._post(url, what, fix, ctx, subject, json_body=payload, headers=headers)
        return _token(body, "accessToken", what, expire_time="expireTime")

    async def grant(
        self, token_uri: str, assertion: str, email: str, subject: str, ctx: FetchContext
    ) -> AccessToken:
        """A service account key's JWT-bearer grant at its (already allowed) token_uri."""
        what = f"the token request of key {email} at {token_uri} for {subject}"
        fix = "check that the key in nodePublishSecretRef key.json is valid and not disabled"
        form = {"grant_type": JWT_BEARER, "assertion": assertion}
        body = await self._post(token_uri, what, fix, ctx, subject, data=form)
        return _token(body, "access_token", what, expires_in="expires_in")

    async def _post(
        self,
        url: str,
        what: str,
        fix: str,
        ctx: FetchContext,
        subject: str,
        *,
        data: Mapping[str, str] | None = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Mapping[str, Any]:
        if self._session is None:
            ssl_context = None
            if self._ca_file:
                with translated(f"reading --gcp-ca-file {self._ca_file}", subject):
                    ssl_context = ssl.create_default_context(cafile=self._ca_file)
            self._resolver = Resolver()
            connector = aiohttp.TCPConnector(
                ssl=ssl_context if ssl_context else True, resolver=self._resolver
            )
            self._session = aiohttp.ClientSession(
                connector=connector, request_class=proxied_requests(self._proxies)
            )
        seconds = max(0.1, min(CALL_TIMEOUT, ctx.deadline - time.monotonic()))
        with translated(what, subject):
            try:
                async with self._session.post(
                    url,
                    data=data,
                    json=json_body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=seconds),
                    allow_redirects=False,
                ) as response:
                    raw = await read_capped(response, MAX_ANSWER, what)
                    text = raw.decode("utf-8", errors="replace")
                    if response.status != 200:
                        retry_after = response.headers.get("Retry-After")
                        raise http_error(response.status, text, what, fix, retry_after)
            except (aiohttp.ClientError, OSError) as exc:
                if is_tls_failure(exc):
                    raise tls_error(what, endpoint_of(url), self._ca_file, exc) from exc
                raise
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, dict):
            raise StoreUnavailable(f"{what}: the answer is not a JSON object")
        return parsed

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._resolver is not None:
            await self._resolver.close()
            self._resolver = None


def endpoint_of(url: str) -> str:
    """`https://host:port/path` of a token URL, for messages (no query, no credentials)."""
    try:
        parsed = URL(url)
    except ValueError:
        return "the token endpoint"
    return str(parsed.with_query(None).with_fragment(None).with_user(None))


def _token(
    body: Mapping[str, Any],
    field_name: str,
    what: str,
    *,
    expires_in: str | None = None,
    expire_time: str | None = None,
) -> AccessToken:
    token = body.get(field_name)
    if not isinstance(token, str) or not token:
        raise StoreUnavailable(f"{what}: the answer has no {field_name}")
    lifetime = 3600.0
    if expires_in is not None and isinstance(body.get(expires_in), int | float):
        lifetime = float(body[expires_in])
    elif expire_time is not None and isinstance(body.get(expire_time), str):
        lifetime = _until(body[expire_time])
    return AccessToken(token, time.monotonic() + lifetime)


def _until(rfc3339: str) -> float:
    """Seconds until an RFC 3339 instant (IAM's expireTime); 0 when unreadable."""
    try:
        instant = datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    now = datetime.datetime.now(datetime.UTC)
    return max(0.0, (instant - now).total_seconds())
