"""Google workload identity: the pod's Kubernetes token for a Google credential.

STS (RFC 8693, form-encoded as google-auth sends it) trades the pod's token, minted for the
cluster's workload identity pool, for a federated access token of the pod's own principal; IAM
credentials then trades that for a Google service account's access token (generateAccessToken:
the gcp store) or a JWT signed as the service account (signJwt: Vault's gcp login). A service
account key's signed assertion is traded at its `token_uri` the same way (`grant`).

All are plain HTTPS JSON APIs, called with aiohttp on the session of one `GoogleTokens`, each
answer capped in bytes (`MAX_ANSWER`) and time (the caller's deadline, at most `CALL_TIMEOUT`),
never following a redirect, and reported by status and known error code only (gcp_errors.py).
Each goes through the proxy the environment names for its URL (backends/proxies.py).
"""

from __future__ import annotations

import datetime
import json
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from backends.clouds.gcp_errors import http_error, wire_error
from backends.clouds.names import GSA_ANNOTATION
from backends.proxies import Proxies, proxied_requests
from backends.wire import MAX_SMALL_BODY, Resolver, read_capped
from provider.core.errors import InvalidParameters, StoreUnavailable, scrub

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
#: Upper bound of one token call; the caller's deadline usually cuts it shorter.
CALL_TIMEOUT = 30.0
#: Cap of one token answer (a token response is under 4 KiB).
MAX_ANSWER = MAX_SMALL_BODY
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+")


@dataclass(frozen=True)
class AccessToken:
    token: str = field(repr=False)
    #: time.monotonic() at which Google stops accepting it.
    expires: float


@dataclass(frozen=True)
class Call:
    """How messages name one token call: `what` it does (and as whom), `fix` when refused;
    `deadline` (time.monotonic()) bounds it."""

    what: str
    fix: str
    deadline: float


class GoogleTokens:
    """Google's token APIs over one aiohttp session, opened on first use (in the running loop).

    `ca_file` is the trust of every call (the system's CAs when None), named `ca_flag` in
    messages.
    """

    def __init__(
        self,
        ca_file: str | None = None,
        ca_flag: str = "--gcp-ca-file",
        proxies: Proxies | None = None,
    ) -> None:
        self._ca_file = ca_file
        self._ca_flag = ca_flag
        self._proxies = proxies or Proxies.from_env()
        self._session: aiohttp.ClientSession | None = None
        self._resolver: Resolver | None = None

    async def exchange(
        self, sts_url: str, audience: str, pod_token: str, call: Call
    ) -> AccessToken:
        """The federated access token of the pod's token at STS, for STS audience `audience`."""
        form = {
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "audience": audience,
            "scope": SCOPE,
            "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
            "subject_token": pod_token,
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        }
        body = await self._post(sts_url, call, data=form)
        return _token(body, "access_token", call.what, expires_in="expires_in")

    async def impersonate(
        self, iam_url: str, federated: str, gsa: str, delegates: list[str], call: Call
    ) -> AccessToken:
        """Service account `gsa`'s access token (IAM generateAccessToken), as `federated`."""
        payload: dict[str, Any] = {"scope": [SCOPE]}
        if delegates:
            payload["delegates"] = [f"projects/-/serviceAccounts/{d}" for d in delegates]
        url = _account_url(iam_url, gsa, "generateAccessToken")
        body = await self._post(url, call, json_body=payload, headers=_bearer(federated))
        return _token(body, "accessToken", call.what, expire_time="expireTime")

    async def sign_jwt(
        self, iam_url: str, federated: str, gsa: str, claims: Mapping[str, Any], call: Call
    ) -> str:
        """`claims` signed as service account `gsa` (IAM signJwt), as `federated`."""
        payload = {"payload": json.dumps(claims)}
        url = _account_url(iam_url, gsa, "signJwt")
        body = await self._post(url, call, json_body=payload, headers=_bearer(federated))
        return _field(body, "signedJwt", call.what)

    async def grant(self, token_uri: str, assertion: str, call: Call) -> AccessToken:
        """A signed assertion's JWT-bearer grant (RFC 7523) at an (already allowed) token_uri."""
        form = {"grant_type": JWT_BEARER, "assertion": assertion}
        body = await self._post(token_uri, call, data=form)
        return _token(body, "access_token", call.what, expires_in="expires_in")

    async def _post(
        self,
        url: str,
        call: Call,
        *,
        data: Mapping[str, str] | None = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Mapping[str, Any]:
        session = self._open()
        seconds = max(0.1, min(CALL_TIMEOUT, call.deadline - time.monotonic()))
        try:
            async with session.post(
                url,
                data=data,
                json=json_body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=seconds),
                allow_redirects=False,
            ) as response:
                raw = await read_capped(response, MAX_ANSWER, call.what)
                text = raw.decode("utf-8", errors="replace")
                if response.status != 200:
                    retry_after = response.headers.get("Retry-After")
                    raise http_error(response.status, text, call.what, call.fix, retry_after)
        except (aiohttp.ClientError, OSError) as exc:
            raise wire_error(call.what, url, self._ca_file, self._ca_flag, exc) from exc
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, dict):
            raise StoreUnavailable(f"{call.what}: the answer is not a JSON object")
        return parsed

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            try:
                # Built per session (not aiohttp's context of import time), so SSL_CERT_FILE
                # is read as OpenSSL reads it when no CA file is given.
                ssl_context = ssl.create_default_context(cafile=self._ca_file or None)
            except OSError as exc:  # ssl.SSLError included
                error = StoreUnavailable(
                    f"reading {self._ca_flag} {self._ca_file}: {type(exc).__name__}: {scrub(exc)}"
                )
                error.transient = False  # the file stays as it is within the Mount
                raise error from exc
            self._resolver = Resolver()
            connector = aiohttp.TCPConnector(ssl=ssl_context, resolver=self._resolver)
            self._session = aiohttp.ClientSession(
                connector=connector, request_class=proxied_requests(self._proxies)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._resolver is not None:
            await self._resolver.close()
            self._resolver = None

    async def __aenter__(self) -> GoogleTokens:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def service_account(email: str, subject: str) -> str:
    """`email`, the Google service account ServiceAccount `subject` names (GSA_ANNOTATION), or
    InvalidParameters: it becomes part of the IAM URL that receives the federated token."""
    if not _EMAIL.fullmatch(email):
        raise InvalidParameters(
            f"the ServiceAccount {subject} annotation {GSA_ANNOTATION} must be a Google "
            f"service account email, got {scrub(email, 100)!r}"
        )
    return email


def _account_url(iam_url: str, gsa: str, method: str) -> str:
    return f"{iam_url.rstrip('/')}/v1/projects/-/serviceAccounts/{gsa}:{method}"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _field(body: Mapping[str, Any], name: str, what: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise StoreUnavailable(f"{what}: the answer has no {name}")
    return value


def _token(
    body: Mapping[str, Any],
    field_name: str,
    what: str,
    *,
    expires_in: str | None = None,
    expire_time: str | None = None,
) -> AccessToken:
    token = _field(body, field_name, what)
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
