"""The few Kubernetes API calls the provider makes: two JSON requests over aiohttp.

Reads a ServiceAccount's annotations (AWS role ARN, GCP service account) and, only with
`--token-request-fallback`, mints a pod token through the TokenRequest API. The connection is
built on first use, so a provider that never needs the API never loads its configuration.

Why not kubernetes_asyncio's generated client: importing any part of it imports every API group
and model, which the process then keeps in memory for its whole life, for two calls
(measured: BENCHMARKS.md, "kubernetes_asyncio's generated client"). In a pod (the product's
case) the configuration is read here as client-go reads it: the API server from
KUBERNETES_SERVICE_HOST/PORT, its CA and our token from the mounted service account files, the
token re-read every minute (the kubelet rotates it). Only outside a cluster, without
--kube-api-url, is a kubeconfig read through kubernetes_asyncio's loader (contexts, exec
plugins, client certificates): a developer's run pays for it, a node does not.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from provider.core.errors import MissingCredential, PermissionDenied, StoreUnavailable, scrub

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Seconds between re-reads of the in-cluster token file (client-go's period).
TOKEN_REFRESH = 60.0


@dataclass(frozen=True)
class _Api:
    host: str
    ssl: ssl.SSLContext | bool
    #: The Authorization header value, or None for an unauthenticated --kube-api-url.
    authorization: Callable[[], Awaitable[str | None]]
    proxy: str | None = None


class KubeClient:
    def __init__(self, api_url: str | None = None) -> None:
        self._api_url = api_url
        self._api: _Api | None = None
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> tuple[_Api, aiohttp.ClientSession]:
        async with self._lock:
            if self._api is None:
                self._api = await _configure(self._api_url)
            if self._session is None:
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=self._api.ssl)
                )
            return self._api, self._session

    async def _call(self, method: str, path: str, doing: str, body: Any = None) -> Any:
        api, session = await self._connect()
        headers = {"Accept": "application/json"}
        authorization = await api.authorization()
        if authorization:
            headers["Authorization"] = authorization
        try:
            async with session.request(
                method, api.host + path, json=body, headers=headers, proxy=api.proxy
            ) as response:
                if response.status >= 400:
                    raise _translate(response.status, response.reason or "", doing)
                return await response.json(content_type=None)
        except (OSError, aiohttp.ClientError, ValueError) as exc:
            raise StoreUnavailable(f"Kubernetes API unreachable: {scrub(exc)}") from None

    async def service_account_annotations(self, namespace: str, name: str) -> Mapping[str, str]:
        path = (
            f"/api/v1/namespaces/{quote(namespace, safe='')}/serviceaccounts/{quote(name, safe='')}"
        )
        sa = await self._call("GET", path, f"reading ServiceAccount {namespace}/{name}")
        metadata = sa.get("metadata") if isinstance(sa, dict) else None
        return dict((metadata or {}).get("annotations") or {})

    async def create_token(
        self, namespace: str, service_account: str, audience: str, pod_name: str, pod_uid: str
    ) -> str:
        """A token bound to the pod, as the kubelet would have minted (TokenRequest API)."""
        path = (
            f"/api/v1/namespaces/{quote(namespace, safe='')}"
            f"/serviceaccounts/{quote(service_account, safe='')}/token"
        )
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience],
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": pod_uid,
                },
            },
        }
        doing = f"creating a token for {namespace}/{service_account} (audience {audience!r})"
        result = await self._call("POST", path, doing, body)
        token = (result.get("status") or {}).get("token") if isinstance(result, dict) else None
        if not isinstance(token, str) or not token:
            raise StoreUnavailable(f"Kubernetes API answered no token {doing}")
        return token

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _configure(api_url: str | None) -> _Api:
    if api_url:
        return _Api(api_url.rstrip("/"), ssl=True, authorization=_no_authorization)
    in_cluster = _in_cluster(os.environ, SERVICE_ACCOUNT_DIR)
    if in_cluster is not None:
        return in_cluster
    return await _kubeconfig()


async def _no_authorization() -> str | None:
    return None


def _in_cluster(environ: Mapping[str, str], directory: str) -> _Api | None:
    """The API as a pod sees it, or None outside a cluster."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    token_file, ca_file = f"{directory}/token", f"{directory}/ca.crt"
    if not host or not port or not os.path.isfile(token_file) or not os.path.isfile(ca_file):
        return None
    if ":" in host or "%" in host:
        host = f"[{host}]"
    token = _TokenFile(token_file)
    token.read()  # a pod whose token cannot be read fails here, at first use
    return _Api(f"https://{host}:{port}", ssl.create_default_context(cafile=ca_file), token.get)


class _TokenFile:
    def __init__(self, path: str) -> None:
        self._path = path
        self._value = ""
        self._read_at = 0.0

    def read(self) -> str:
        try:
            with open(self._path) as fh:
                value = fh.read().strip()
        except OSError as exc:
            raise MissingCredential(f"the provider's service account token: {scrub(exc)}") from None
        if not value:
            raise MissingCredential(f"the provider's service account token {self._path} is empty")
        self._value, self._read_at = value, time.monotonic()
        return value

    async def get(self) -> str | None:
        if time.monotonic() - self._read_at >= TOKEN_REFRESH:
            self.read()
        return f"Bearer {self._value}"


async def _kubeconfig() -> _Api:
    """The current kubeconfig context, read by kubernetes_asyncio (outside a cluster only)."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        await config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        raise MissingCredential(
            "the Kubernetes API is not configured: not in a cluster and no "
            f"kubeconfig ({scrub(exc)}); set --kube-api-url"
        ) from None
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE

    async def authorization() -> str | None:
        # Runs the kubeconfig's refresh hook (exec plugins, expiring tokens) when it has one.
        key: str | None = await configuration.get_api_key_with_prefix("BearerToken")
        return key

    return _Api(configuration.host, context, authorization, configuration.proxy)


def _translate(status: int, reason: str, doing: str) -> Exception:
    if status in (401, 403):
        return PermissionDenied(
            f"Kubernetes API refused {doing} (HTTP {status}); check the provider's RBAC"
        )
    if status == 404:
        return MissingCredential(f"{doing}: not found (HTTP 404)")
    return StoreUnavailable(f"Kubernetes API error {doing}: HTTP {status} {scrub(reason)}")
