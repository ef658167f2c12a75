"""The few Kubernetes API calls the provider makes: JSON requests over aiohttp.

Reads a ServiceAccount's annotations (AWS role ARN, GCP service account) and, only with
`--token-request-fallback`, mints a pod token through the TokenRequest API. The change feed
(docs/change-feed.md) adds generic object calls by API path (`get`, `create`, `replace`, `list`,
`watch`) for its ConfigMaps and the watcher's Lease; provider/core/kubewatch.py loops list+watch.
The connection is built on first use, so a provider that never needs the API never loads its
configuration.

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
import builtins
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from provider.core.errors import MissingCredential, PermissionDenied, StoreUnavailable, scrub

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Seconds between re-reads of the in-cluster token file (client-go's period).
TOKEN_REFRESH = 60.0
#: Seconds one object call (get, create, replace, list) may take.
CALL_TIMEOUT = 30.0
#: Bytes of one answer or watch event read (a ConfigMap holds 1 MiB; JSON escapes may double it).
MAX_BODY = 8 * 1024 * 1024
MAX_EVENT = 4 * 1024 * 1024


class Conflict(StoreUnavailable):
    """HTTP 409: the object exists already (create) or changed since it was read (replace)."""


class Gone(StoreUnavailable):
    """HTTP 410, or a watch's ERROR event of code 410: the resourceVersion is too old; relist."""


Object = dict[str, Any]


def pod_namespace() -> str:
    """This pod's namespace: the downward API's POD_NAMESPACE, else the mounted service
    account's namespace file; "" outside a pod."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(os.path.join(SERVICE_ACCOUNT_DIR, "namespace")) as f:
            return f.read().strip()
    except OSError:
        return ""


def namespaced(namespace: str, resource: str, name: str = "", *, group: str = "") -> str:
    """The API path of a namespaced collection, or of one object in it with `name`: the core
    group (`/api/v1/...`) without `group`, else `group` as `<group>/<version>`."""
    root = f"/apis/{group}" if group else "/api/v1"
    path = f"{root}/namespaces/{quote(namespace, safe='')}/{resource}"
    return f"{path}/{quote(name, safe='')}" if name else path


def configmaps(namespace: str, name: str = "") -> str:
    return namespaced(namespace, "configmaps", name)


def leases(namespace: str, name: str = "") -> str:
    return namespaced(namespace, "leases", name, group="coordination.k8s.io/v1")


def endpointslices(namespace: str, name: str = "") -> str:
    return namespaced(namespace, "endpointslices", name, group="discovery.k8s.io/v1")


def resource_version(obj: Mapping[str, Any]) -> str:
    """An object's metadata.resourceVersion ("" when it has none)."""
    metadata = obj.get("metadata")
    version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
    return version if isinstance(version, str) else ""


@dataclass(frozen=True)
class _Api:
    host: str
    ssl: ssl.SSLContext | bool
    #: The Authorization header value, or None for an unauthenticated --kube-api-url.
    authorization: Callable[[], Awaitable[str | None]]
    proxy: str | None = None


class KubeClient:
    """The API server's client. `token` is sent as a bearer token to an `api_url` (a test's
    API server); in a cluster or through a kubeconfig the credentials come from there."""

    def __init__(
        self, api_url: str | None = None, *, token: str | None = None, token_file: str = ""
    ) -> None:
        self._api_url = api_url
        self._token = token
        #: With `api_url`: a bearer token file, re-read as the in-cluster one is.
        self._token_file = token_file
        self._api: _Api | None = None
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> tuple[_Api, aiohttp.ClientSession]:
        async with self._lock:
            if self._api is None:
                self._api = await _configure(self._api_url, self._token, self._token_file)
            if self._session is None:
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=self._api.ssl)
                )
            return self._api, self._session

    async def _call(
        self,
        method: str,
        path: str,
        doing: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        absent: frozenset[int] = frozenset(),
    ) -> Any:
        """The answer's JSON, or None for a status in `absent`; other statuses over 399 raise."""
        api, session = await self._connect()
        headers = await _headers(api)
        timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT)
        try:
            async with session.request(
                method,
                api.host + path,
                json=body,
                params=params,
                headers=headers,
                proxy=api.proxy,
                timeout=timeout,
            ) as response:
                if response.status in absent:
                    return None
                if response.status >= 400:
                    raise _translate(response.status, response.reason or "", doing)
                text = bytearray()
                async for chunk in response.content.iter_any():
                    text += chunk
                    if len(text) > MAX_BODY:
                        raise StoreUnavailable(f"Kubernetes API answered over {MAX_BODY} bytes")
                return json.loads(text)
        except (OSError, aiohttp.ClientError, ValueError) as exc:  # timeouts are OSErrors
            raise StoreUnavailable(f"Kubernetes API unreachable: {scrub(exc)}") from None

    async def get(self, path: str) -> Object | None:
        """The object at `path`, or None if there is none."""
        answer = await self._call("GET", path, f"reading {path}", absent=frozenset({404}))
        return None if answer is None else _object(answer)

    async def create(self, collection: str, body: Mapping[str, Any]) -> Object:
        """The object created in `collection`; Conflict if one of its name exists already."""
        return _object(await self._call("POST", collection, f"creating in {collection}", body))

    async def replace(self, path: str, body: Mapping[str, Any]) -> Object:
        """The object at `path` replaced by `body`, whose metadata.resourceVersion must still be
        the object's (optimistic concurrency); Conflict if it changed meanwhile."""
        return _object(await self._call("PUT", path, f"replacing {path}", body))

    async def delete(self, path: str) -> None:
        await self._call("DELETE", path, f"deleting {path}", absent=frozenset({404}))

    async def list(self, collection: str, selector: str = "") -> tuple[builtins.list[Object], str]:
        """The objects of `collection` matching the label `selector`, and the list's
        resourceVersion (a watch from it misses nothing)."""
        params = {"labelSelector": selector} if selector else {}
        doing = f"listing {collection}"
        answer = _object(await self._call("GET", collection, doing, params=params))
        items = answer.get("items")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise StoreUnavailable(f"Kubernetes API answered no items listing {collection}")
        return items, resource_version(answer)

    async def watch(
        self,
        collection: str,
        selector: str,
        version: str,
        timeout_seconds: int,
        *,
        opened: Callable[[], None] | None = None,
    ) -> AsyncIterator[tuple[str, Object]]:
        """The (type, object) events of `collection` after resourceVersion `version`, BOOKMARK
        included, until the server ends the stream (after `timeout_seconds`). `opened` is called
        once the server accepted the watch. Gone when `version` is too old; StoreUnavailable
        when the stream breaks or an event is over MAX_EVENT bytes."""
        params = {
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if selector:
            params["labelSelector"] = selector
        doing = f"watching {collection}"
        api, session = await self._connect()
        headers = await _headers(api)
        # The server ends the stream; our own timer only catches a server that went silent.
        timeout = aiohttp.ClientTimeout(total=timeout_seconds + CALL_TIMEOUT, sock_connect=10)
        try:
            async with session.get(
                api.host + collection,
                params=params,
                headers=headers,
                proxy=api.proxy,
                timeout=timeout,
            ) as response:
                if response.status >= 400:
                    raise _translate(response.status, response.reason or "", doing)
                if opened is not None:
                    opened()
                async for line in _lines(response.content, MAX_EVENT):
                    yield _event(line, doing)
        except (OSError, aiohttp.ClientError, ValueError) as exc:  # timeouts are OSErrors
            raise StoreUnavailable(f"Kubernetes API watch broke: {scrub(exc)}") from None

    async def service_account_annotations(self, namespace: str, name: str) -> Mapping[str, str]:
        path = namespaced(namespace, "serviceaccounts", name)
        sa = await self._call("GET", path, f"reading ServiceAccount {namespace}/{name}")
        metadata = sa.get("metadata") if isinstance(sa, dict) else None
        return dict((metadata or {}).get("annotations") or {})

    async def create_token(
        self, namespace: str, service_account: str, audience: str, pod_name: str, pod_uid: str
    ) -> str:
        """A token bound to the pod, as the kubelet would have minted (TokenRequest API)."""
        path = namespaced(namespace, "serviceaccounts", service_account) + "/token"
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


async def _configure(api_url: str | None, token: str | None, token_file: str = "") -> _Api:
    if api_url:
        if token_file:
            read = _TokenFile(token_file)
            read.read()
            return _Api(api_url.rstrip("/"), ssl=True, authorization=read.get)
        return _Api(api_url.rstrip("/"), ssl=True, authorization=_bearer(token))
    in_cluster = _in_cluster(os.environ, SERVICE_ACCOUNT_DIR)
    if in_cluster is not None:
        return in_cluster
    return await _kubeconfig()


def _bearer(token: str | None) -> Callable[[], Awaitable[str | None]]:
    async def authorization() -> str | None:
        return f"Bearer {token}" if token else None

    return authorization


async def _headers(api: _Api) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    authorization = await api.authorization()
    if authorization:
        headers["Authorization"] = authorization
    return headers


def _object(answer: Any) -> Object:
    if not isinstance(answer, dict):
        raise StoreUnavailable("Kubernetes API answered something other than an object")
    return answer


async def _lines(content: aiohttp.StreamReader, limit: int) -> AsyncIterator[bytes]:
    """The newline-ended lines of a stream, each at most `limit` bytes (aiohttp's own readline
    refuses lines over twice its read buffer, 128 KiB: less than one ConfigMap)."""
    buffer = bytearray()
    async for chunk in content.iter_any():
        buffer += chunk
        while (end := buffer.find(b"\n", 0, limit + 1)) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if line.strip():
                yield line
        if len(buffer) > limit:
            raise StoreUnavailable(f"a Kubernetes watch event over {limit} bytes")


def _event(line: bytes, doing: str) -> tuple[str, Object]:
    try:
        event = json.loads(line)
    except ValueError:
        raise StoreUnavailable(f"{doing}: an event that is not JSON") from None
    kind = event.get("type") if isinstance(event, dict) else None
    obj = event.get("object") if isinstance(event, dict) else None
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise StoreUnavailable(f"{doing}: an event without type and object")
    if kind == "ERROR":
        code = obj.get("code")
        if code == 410:
            raise Gone(f"{doing}: the resourceVersion is too old (410 in the stream)")
        raise StoreUnavailable(f"{doing}: the server ended the watch with code {scrub(code, 8)}")
    return kind, obj


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
    if status == 409:
        return Conflict(f"Kubernetes API conflict {doing} (HTTP 409)")
    if status == 410:
        return Gone(f"{doing}: the resourceVersion is too old (HTTP 410)")
    if status in (401, 403):
        return PermissionDenied(
            f"Kubernetes API refused {doing} (HTTP {status}); check the provider's RBAC"
        )
    if status == 404:
        return MissingCredential(f"{doing}: not found (HTTP 404)")
    return StoreUnavailable(f"Kubernetes API error {doing}: HTTP {status} {scrub(reason)}")
