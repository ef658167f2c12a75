"""Who the pod is for Google, and the access token that proves it.

pod-adc (default), as the GCP provider does it: the pod's service account token, minted by the
kubelet for the workload identity pool, is exchanged at STS (RFC 8693 token exchange) for a
federated access token; when the ServiceAccount carries `iam.gke.io/gcp-service-account`, that
token then impersonates the Google service account through IAM generateAccessToken.
provider-adc uses the provider's own Application Default Credentials (node identity, allowed
per namespace), and a nodePublishSecretRef `key.json` a service account key (keyfile.py: its
token_uri must be Google's or a configured one, and its grant is posted like every token call).
The token calls themselves are backends/clouds/gcp.py's, shared with Vault's gcp login.

google-auth is blocking (provider-adc), and loading a key costs CPU: both run on the
backend's own small thread pool (`AUTH_THREADS`), each call bounded by the Mount's deadline
and each HTTP request by `ADC_HTTP_TIMEOUT`, so a slow metadata server never holds a thread that
another backend's name resolution (or anything else on the default executor) needs.

`identify` only gathers the login material (refusing a pod without a token before any cache is
consulted); `access_token` turns it into a token, cached per identity key until shortly before
it expires, so a rollout of many pods of one ServiceAccount logs in once.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from backends.clouds.gcp import (
    CALL_TIMEOUT,
    SCOPE,
    AccessToken,
    Call,
    GoogleTokens,
    service_account,
)
from backends.clouds.gcp_errors import endpoint_of, is_tls_failure, tls_error
from backends.clouds.names import GSA_ANNOTATION
from backends.gcp.dialect import Audience, GcpStore, Ref
from backends.gcp.errors import translated
from backends.gcp.keyfile import KEY_FILE, ServiceAccountKey, assertion, parse_key
from backends.gcp.options import Options
from provider.core.backend import BackendEnv
from provider.core.errors import DeadlineExceeded, InvalidParameters, MissingCredential
from provider.core.identity import pod_scope, pod_token, require_node_identity
from provider.core.model import FetchContext, Identity, Pod, StorePlan, credential_hash
from provider.core.model import identity_key as make_key

DELEGATES_ANNOTATION = "iam.gke.io/gcp-service-account-delegates"
T = TypeVar("T")
#: Threads of the backend's own pool for google-auth (ADC) and key signing.
AUTH_THREADS = 2
#: Seconds one HTTP request of google-auth may take (its own default is 120).
ADC_HTTP_TIMEOUT = 10.0
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
    key: ServiceAccountKey = field(repr=False)


@dataclass(frozen=True)
class NodeLogin:
    pass


class Authenticator:
    def __init__(self, env: BackendEnv[Options], tokens: GoogleTokens) -> None:
        self._env = env
        self._tokens = tokens
        self._executor = ThreadPoolExecutor(
            AUTH_THREADS, thread_name_prefix="secrets-bridge-gcp-auth"
        )

    async def identify(self, plan: StorePlan[GcpStore, Ref], pod: Pod) -> Identity:
        store = plan.store
        scope = pod_scope(self._env, pod)
        key_json = pod.node_publish_secret.get(KEY_FILE)
        if key_json is not None:
            if store.auth_explicit:
                raise InvalidParameters(
                    f"auth: {store.auth} and a nodePublishSecretRef with {KEY_FILE} both choose "
                    "how to authenticate; remove one of them"
                )
            parsed = parse_key(key_json, self._env.options)
            cred_key = credential_hash({KEY_FILE: key_json})
            return Identity(make_key("gcp", "key", cred_key, scope), pod.subject, KeyLogin(parsed))
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
        if isinstance(login, KeyLogin):
            return await self._key_grant(login.key, identity.subject, ctx)
        with (
            self._env.metrics.backend_call("gcp", "GoogleAuthRefresh"),
            translated("authenticating with Google credentials", identity.subject),
        ):
            return await self._blocking(partial(_google_auth_token, self._env.options.ca_file), ctx)

    async def _key_grant(
        self, key: ServiceAccountKey, subject: str, ctx: FetchContext
    ) -> AccessToken:
        granting = Call(
            f"the token request of key {key.email} at {key.token_uri} for {subject}",
            "check that the key in nodePublishSecretRef key.json is valid and not disabled",
            ctx.deadline,
        )

        async def grant() -> AccessToken:
            with (
                self._env.metrics.backend_call("gcp", "GoogleAuthRefresh"),
                translated(f"signing with key {key.email}", subject),
            ):
                # Loading an RSA key is CPU-heavy: a tenant's many keys must not stall the loop,
                # so it runs on the backend's threads too
                # (measured: BENCHMARKS.md, "Loading a Google service account key").
                signed = await self._blocking(partial(assertion, key), ctx)
                return await self._tokens.grant(key.token_uri, signed, granting)

        return await self._env.retry(grant, ctx)

    async def _blocking(self, call: Callable[[], T], ctx: FetchContext) -> T:
        """`call()` on the backend's own threads, given up with the Mount (the thread then ends
        with its own HTTP timeout; the pool stays bounded)."""
        remaining = min(CALL_TIMEOUT, ctx.deadline - time.monotonic())
        if remaining <= 0:
            raise DeadlineExceeded("no time left to authenticate before the mount's deadline")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(remaining):
                return await loop.run_in_executor(self._executor, call)
        except TimeoutError:
            raise DeadlineExceeded("Google authentication did not finish in time") from None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _workload_identity(
        self, login: PodLogin, subject: str, ctx: FetchContext
    ) -> AccessToken:
        audience = login.audience
        exchanging = Call(
            f"the STS token exchange for {subject} (audience {audience.sts!r})",
            f"check that the pod's token is issued for audience {audience.token!r} and "
            "that the provider's --gcp-project/--gcp-location/--gcp-cluster name this cluster",
            ctx.deadline,
        )
        sts = self._env.options.sts_endpoint

        # retries need an `async def` (tenacity treats a lambda as synchronous).
        async def exchange() -> AccessToken:
            with self._env.metrics.backend_call("gcp", "StsExchange"):
                return await self._tokens.exchange(sts, audience.sts, login.token, exchanging)

        federated = await self._env.retry(exchange, ctx)
        annotations = await self._env.kube.service_account_annotations(
            login.namespace, login.service_account
        )
        gsa = annotations.get(GSA_ANNOTATION, "").strip()
        if not gsa:
            # Without the annotation the federated token itself is used: IAM bindings then name
            # the principal of the Kubernetes ServiceAccount directly.
            return federated
        gsa = service_account(gsa, subject)  # it becomes part of the IAM URL
        delegates = _delegates(annotations.get(DELEGATES_ANNOTATION), subject)
        impersonating = Call(
            f"IAM generateAccessToken for {gsa} as {subject}",
            f"grant roles/iam.workloadIdentityUser on {gsa} to the Kubernetes ServiceAccount "
            f"{subject} (annotation {GSA_ANNOTATION})",
            ctx.deadline,
        )
        iam, token = self._env.options.iam_endpoint, federated.token

        async def impersonate() -> AccessToken:
            with self._env.metrics.backend_call("gcp", "GenerateAccessToken"):
                return await self._tokens.impersonate(iam, token, gsa, delegates, impersonating)

        return await self._env.retry(impersonate, ctx)


def _delegates(raw: str | None, subject: str) -> list[str]:
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidParameters(
            f"the ServiceAccount {subject} annotation {DELEGATES_ANNOTATION} must be a JSON "
            'list of service account emails, e.g. ["a@p.iam.gserviceaccount.com"]'
        )
    return value


def _google_auth_token(ca_file: str | None) -> AccessToken:
    """A token from the provider's own Application Default Credentials (blocking: runs on the
    backend's threads); every HTTPS request trusts --gcp-ca-file when it is set."""
    import google.auth
    from google.auth.exceptions import TransportError
    from google.auth.transport.requests import Request

    class BoundedRequest(Request):  # type: ignore[misc]
        # google-auth calls its transport without a timeout, which then defaults to 120 s.
        def __call__(self, *args: Any, timeout: Any = None, **kwargs: Any) -> Any:
            bound = min(float(timeout or ADC_HTTP_TIMEOUT), ADC_HTTP_TIMEOUT)
            if ca_file:
                # Passed per request: requests would let REQUESTS_CA_BUNDLE override a
                # session-wide setting, and its default is certifi's bundle.
                kwargs["verify"] = ca_file
            try:
                return super().__call__(*args, timeout=bound, **kwargs)
            except TransportError as exc:
                if not is_tls_failure(exc):
                    raise
                url = str(kwargs.get("url") or (args[0] if args else ""))
                what = "the token request of the provider's Application Default Credentials"
                raise tls_error(what, endpoint_of(url), ca_file, exc) from exc

    credentials: Any
    credentials, _project = google.auth.default(scopes=[SCOPE])
    credentials.refresh(BoundedRequest())
    lifetime = 3600.0
    if credentials.expiry is not None:
        expiry = credentials.expiry.replace(tzinfo=datetime.UTC)
        lifetime = (expiry - datetime.datetime.now(datetime.UTC)).total_seconds()
    return AccessToken(str(credentials.token), time.monotonic() + lifetime)
