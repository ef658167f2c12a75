"""Who the pod is for Google, and the access token that proves it.

pod-adc (default), as the GCP provider does it: the pod's service account token, minted by the
kubelet for the workload identity pool, is exchanged at STS (RFC 8693 token exchange) for a
federated access token; when the ServiceAccount carries `iam.gke.io/gcp-service-account`, that
token then impersonates the Google service account through IAM generateAccessToken.
provider-adc uses the provider's own Application Default Credentials (node identity, allowed
per namespace), and a nodePublishSecretRef `key.json` a service account key.

`identify` only gathers the login material (refusing a pod without a token before any cache is
consulted); `access_token` turns it into a token, cached per identity key until shortly before
it expires, so a rollout of many pods of one ServiceAccount logs in once.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from backends.base import BackendEnv, FetchContext, Identity, Pod, StorePlan, credential_hash
from backends.base import identity_key as make_key
from backends.gcp.errors import http_error, translated
from backends.gcp.params import Audience, GcpStore
from provider.errors import InvalidParameters, MissingCredential, StoreUnavailable
from provider.identity import pod_scope, pod_token, require_node_identity
from provider.retrying import retry_transient

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
GSA_ANNOTATION = "iam.gke.io/gcp-service-account"
DELEGATES_ANNOTATION = "iam.gke.io/gcp-service-account-delegates"
KEY_FILE = "key.json"
#: Tokens are dropped this long before they expire, so a fetch never starts with a dying token.
EXPIRY_MARGIN = 120.0


@dataclass(frozen=True)
class PodLogin:
    audience: Audience
    namespace: str
    service_account: str
    token: str = field(repr=False)


@dataclass(frozen=True)
class KeyLogin:
    key_json: str = field(repr=False)


@dataclass(frozen=True)
class NodeLogin:
    pass


@dataclass(frozen=True)
class AccessToken:
    token: str = field(repr=False)
    #: time.monotonic() at which Google stops accepting it.
    expires: float


class Authenticator:
    def __init__(self, env: BackendEnv, session: Session, options: Any) -> None:
        self._env = env
        self._options = options
        self._session = session

    async def identify(self, plan: StorePlan, pod: Pod) -> Identity:
        store = plan.store
        assert isinstance(store, GcpStore)
        scope = pod_scope(self._env, pod)
        key_json = pod.node_publish_secret.get(KEY_FILE)
        if key_json is not None:
            if store.auth_explicit:
                raise InvalidParameters(
                    f"auth: {store.auth} and a nodePublishSecretRef with {KEY_FILE} both choose "
                    "how to authenticate; remove one of them"
                )
            cred_key = credential_hash({KEY_FILE: key_json})
            return Identity(
                make_key("gcp", "key", cred_key, scope), pod.subject, KeyLogin(key_json)
            )
        if store.auth == "provider-adc":
            require_node_identity(self._env, pod, "auth: provider-adc")
            return Identity(make_key("gcp", "provider-adc", scope), pod.subject, NodeLogin())
        if store.audience is None:
            raise MissingCredential("the provider has no GCP workload identity pool configured")
        token = await pod_token(self._env, pod, store.audience.token)
        login = PodLogin(store.audience, pod.namespace, pod.service_account, token)
        key = make_key("gcp", "pod-adc", store.audience.sts, scope)
        return Identity(key, pod.subject, login)

    async def access_token(self, identity: Identity, ctx: FetchContext) -> AccessToken:
        async def load() -> tuple[Any, float]:
            token = await self._login(identity, ctx)
            remaining = token.expires - time.monotonic()
            margin = min(EXPIRY_MARGIN, remaining / 4)
            return token, remaining - margin

        token: AccessToken = await self._env.credentials.get_or_load(identity.key, load)
        return token

    def forget(self, identity: Identity, stale: AccessToken) -> None:
        self._env.credentials.invalidate(identity.key, stale)

    async def _login(self, identity: Identity, ctx: FetchContext) -> AccessToken:
        login = identity.credential
        if isinstance(login, PodLogin):
            return await self._workload_identity(login, identity.subject, ctx)
        with translated("authenticating with Google credentials", identity.subject):
            return await asyncio.to_thread(_google_auth_token, login)

    async def _workload_identity(
        self, login: PodLogin, subject: str, ctx: FetchContext
    ) -> AccessToken:
        # retry_transient needs an `async def` (tenacity treats a lambda as synchronous).
        async def exchange() -> AccessToken:
            return await self._exchange(login, subject, ctx)

        federated = await retry_transient(exchange, ctx)
        annotations = await self._env.kube.service_account_annotations(
            login.namespace, login.service_account
        )
        gsa = annotations.get(GSA_ANNOTATION, "").strip()
        if not gsa:
            # Without the annotation the federated token itself is used: IAM bindings then name
            # the principal of the Kubernetes ServiceAccount directly.
            return federated
        delegates = _delegates(annotations.get(DELEGATES_ANNOTATION), subject)

        async def impersonate() -> AccessToken:
            return await self._impersonate(federated, gsa, delegates, subject, ctx)

        return await retry_transient(impersonate, ctx)

    async def _exchange(self, login: PodLogin, subject: str, ctx: FetchContext) -> AccessToken:
        form = {
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "audience": login.audience.sts,
            "scope": SCOPE,
            "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
            "subject_token": login.token,
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        }
        what = f"the STS token exchange for {subject} (audience {login.audience.sts!r})"
        fix = (
            f"check that the pod's token is issued for audience {login.audience.token!r} and "
            "that the provider's --gcp-project/--gcp-location/--gcp-cluster name this cluster"
        )
        body = await self._session.post(
            self._options.sts_endpoint, what, fix, ctx, subject, data=form
        )
        return _token(body, "access_token", what, expires_in="expires_in")

    async def _impersonate(
        self,
        federated: AccessToken,
        gsa: str,
        delegates: list[str],
        subject: str,
        ctx: FetchContext,
    ) -> AccessToken:
        base = self._options.iam_endpoint.rstrip("/")
        url = f"{base}/v1/projects/-/serviceAccounts/{gsa}:generateAccessToken"
        what = f"IAM generateAccessToken for {gsa} as {subject}"
        fix = (
            f"grant roles/iam.workloadIdentityUser on {gsa} to the Kubernetes ServiceAccount "
            f"{subject} (annotation {GSA_ANNOTATION})"
        )
        payload: dict[str, Any] = {"scope": [SCOPE]}
        if delegates:
            payload["delegates"] = [f"projects/-/serviceAccounts/{d}" for d in delegates]
        headers = {"Authorization": f"Bearer {federated.token}"}
        body = await self._session.post(
            url, what, fix, ctx, subject, json_body=payload, headers=headers
        )
        return _token(body, "accessToken", what, expire_time="expireTime")


class Session:
    """The aiohttp session for STS and IAM, opened on first use (inside the running loop)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def post(
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
            self._session = aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=max(0.1, min(30.0, ctx.deadline - time.monotonic())))
        with translated(what, subject):
            async with self._session.post(
                url, data=data, json=json_body, headers=headers, timeout=timeout
            ) as response:
                text = await response.text()
                if response.status != 200:
                    retry_after = response.headers.get("Retry-After")
                    raise http_error(response.status, text, what, fix, retry_after)
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise StoreUnavailable(f"{what}: the answer is not a JSON object")
        return parsed

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


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


def _delegates(raw: str | None, subject: str) -> list[str]:
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidParameters(
            f"the ServiceAccount {subject} annotation {DELEGATES_ANNOTATION} must be a JSON "
            'list of service account emails, e.g. ["a@p.iam.gserviceaccount.com"]'
        )
    return value


def _google_auth_token(login: Any) -> AccessToken:
    """A token from google-auth credentials (blocking: runs in a worker thread)."""
    import google.auth
    from google.auth.transport.requests import Request
    from google.oauth2 import service_account

    if isinstance(login, KeyLogin):
        info = json.loads(login.key_json)
        credentials: Any = service_account.Credentials.from_service_account_info(
            info, scopes=[SCOPE]
        )
    else:
        credentials, _project = google.auth.default(scopes=[SCOPE])
    credentials.refresh(Request())
    lifetime = 3600.0
    if credentials.expiry is not None:
        expiry = credentials.expiry.replace(tzinfo=datetime.UTC)
        lifetime = (expiry - datetime.datetime.now(datetime.UTC)).total_seconds()
    return AccessToken(str(credentials.token), time.monotonic() + lifetime)
