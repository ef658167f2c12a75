"""Secret Manager over gRPC: one channel per endpoint, shared by every mount and identity.

Channels carry no credentials of their own: each call carries the identity's access token as
`authorization` metadata, so pods of different identities share the connection but never a
token. Regional secrets (`projects/*/locations/<l>/...`) are served only by their location's
endpoint, hence the channel per endpoint. The library's own retries are switched off: retries
belong to `retry_transient`, which knows the Mount's deadline.

A class chooses the location, so it chooses how many regional endpoints we open: channels are
an LRU of `MAX_CHANNELS`; one that falls out is closed `RETIRE_AFTER` later (calls in flight
on it finish first).

gRPC reads only the lower-case proxy variables itself (grpc_proxy, https_proxy, http_proxy,
no_grpc_proxy, no_proxy), so HTTPS_PROXY and NO_PROXY, the spellings Kubernetes manifests
use, would not apply; each channel is told instead what backends/wire.py `Proxies` decided for
its endpoint, as for every other store call (`proxy_options`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.cloud.secretmanager_v1.services.secret_manager_service import (
    SecretManagerServiceAsyncClient,
)
from google.cloud.secretmanager_v1.services.secret_manager_service.transports import (
    SecretManagerServiceGrpcAsyncIOTransport,
)

from backends.gcp.dialect import GcpRef
from backends.gcp.errors import SECRET_LISTING, translated
from backends.proxies import Proxies
from provider.core.errors import DeadlineExceeded, StoreUnavailable
from provider.core.limits import answer_size, charge

# The generated client logs every call's metadata (our bearer token) and response (the secret)
# whenever its logger is enabled for DEBUG, and google-auth logs token requests the same way.
# The provider's log setup quiets "google", but a debug session or GOOGLE_SDK_PYTHON_LOGGING_SCOPE
# can lower it again; these more specific levels win over both.
for _name in ("google.cloud.secretmanager_v1", "google.auth", "google.oauth2"):
    logging.getLogger(_name).setLevel(logging.WARNING)

#: Upper bound of one call; the Mount's deadline usually cuts it shorter.
CALL_TIMEOUT = 30.0
# Secret Manager payloads are at most 64 KiB; a page of ListSecrets (backends/gcp/selecting.py)
# holds up to 100 secrets, each with at most 64 labels and 16 KiB of annotations.
_MAX_MESSAGE = 4 * 1024 * 1024
#: Channels kept open (the global endpoint and the regions in use on one node).
MAX_CHANNELS = 16
#: Seconds a retired channel stays open for calls still using it (longer than one call).
RETIRE_AFTER = 2 * CALL_TIMEOUT


@dataclass(frozen=True)
class Page:
    """One list call: what is listed (`parent`, at `location`'s endpoint), how, and where."""

    parent: str
    location: str | None
    filter: str
    size: int
    token: str = ""


@dataclass(frozen=True)
class Listing:
    """One page of a list call: (name, attributes) per item, and the next page's token."""

    items: tuple[tuple[str, dict[str, str]], ...]
    next_token: str


@dataclass(frozen=True)
class Accessed:
    data: bytes = field(repr=False)
    #: The resolved version name (`…/versions/7` for `…/versions/latest`).
    name: str


class SecretManager:
    #: Largest answer accepted on a channel.
    max_message = _MAX_MESSAGE

    def __init__(self, options: Any) -> None:
        self._options = options
        self._clients: OrderedDict[str, tuple[grpc.aio.Channel, Any]] = OrderedDict()
        self._retired: list[tuple[float, grpc.aio.Channel]] = []
        self._proxies = Proxies.from_env()

    def endpoint(self, ref: GcpRef) -> str:
        if ref.location is None:
            return str(self._options.secretmanager_endpoint)
        return str(self._options.regional_endpoint).replace("{location}", ref.location)

    async def _client(self, endpoint: str) -> Any:
        entry = self._clients.get(endpoint)
        if entry is not None:
            self._clients.move_to_end(endpoint)
        else:
            await self._close_retired(time.monotonic() - RETIRE_AFTER)
            if self._options.local_channel:
                creds = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
            else:
                creds = grpc.ssl_channel_credentials(root_certificates=self._roots())
            channel = grpc.aio.secure_channel(
                endpoint,
                creds,
                options=[
                    ("grpc.max_receive_message_length", self.max_message),
                    ("grpc.enable_retries", 0),
                    *proxy_options(self._proxies, endpoint),
                ],
            )
            entry = (channel, self._make_client(channel))
            self._clients[endpoint] = entry
            while len(self._clients) > MAX_CHANNELS:
                _, (old, _client) = self._clients.popitem(last=False)
                self._retired.append((time.monotonic(), old))
        return entry[1]

    def _make_client(self, channel: grpc.aio.Channel) -> Any:
        """The service's client on `channel` (backends/gcp/parameters.py reuses the channels)."""
        transport = SecretManagerServiceGrpcAsyncIOTransport(channel=channel)
        return SecretManagerServiceAsyncClient(transport=transport)

    async def _close_retired(self, before: float) -> None:
        keep = []
        for stamp, channel in self._retired:
            if stamp <= before:
                await channel.close()
            else:
                keep.append((stamp, channel))
        self._retired = keep

    def _roots(self) -> bytes | None:
        """The CA bundle from --gcp-ca-file, or None for gRPC's own roots."""
        ca_file = self._options.ca_file
        if not ca_file:
            return None
        try:
            with open(ca_file, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise StoreUnavailable(
                f"--gcp-ca-file {ca_file} cannot be read: {exc.strerror}"
            ) from None

    async def _ready(self, location: str | None, what: str, deadline: float) -> tuple[Any, float]:
        """The client of `location`'s endpoint and the call's timeout, or DeadlineExceeded."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"no time left to read {what} before the mount's deadline")
        client = await self._client(self.endpoint(GcpRef(what, location)))
        return client, min(CALL_TIMEOUT, remaining)

    async def access(self, ref: GcpRef, token: str, subject: str, deadline: float) -> Accessed:
        client, timeout = await self._ready(ref.location, ref.name, deadline)
        with translated(ref.name, subject):
            response = await client.access_secret_version(
                request={"name": ref.name},
                metadata=[("authorization", f"Bearer {token}")],
                retry=None,
                timeout=timeout,
            )
        data = bytes(response.payload.data)
        # Charged once received (gRPC hands the message whole): Secret Manager bounds a
        # version's payload at 64 KiB; a server of the class's own is bounded by the channel's
        # receive limit (4 MiB).
        await charge(len(data) + len(response.name))
        return Accessed(data, str(response.name) or ref.name)

    async def list_secrets(self, page: Page, token: str, subject: str, deadline: float) -> Listing:
        """One page of ListSecrets: each secret's name and labels, and the next page's token."""
        client, timeout = await self._ready(page.location, page.parent, deadline)
        with translated(page.parent, subject, SECRET_LISTING):
            # One page only: the pager's own iteration would follow tokens without a bound.
            pager = await client.list_secrets(
                request={
                    "parent": page.parent,
                    "filter": page.filter,
                    "page_size": page.size,
                    "page_token": page.token,
                },
                metadata=[("authorization", f"Bearer {token}")],
                retry=None,
                timeout=timeout,
            )
        items = tuple((str(s.name), dict(s.labels)) for s in pager.secrets)
        await charge(answer_size(items))  # a page: at most page_size secrets and their labels
        return Listing(items, str(pager.next_page_token))

    async def list_versions(self, page: Page, token: str, subject: str, deadline: float) -> Listing:
        """One page of ListSecretVersions (newest first): each version's name and state."""
        client, timeout = await self._ready(page.location, page.parent, deadline)
        with translated(page.parent, subject, SECRET_LISTING):
            pager = await client.list_secret_versions(
                request={
                    "parent": page.parent,
                    "filter": page.filter,
                    "page_size": page.size,
                    "page_token": page.token,
                },
                metadata=[("authorization", f"Bearer {token}")],
                retry=None,
                timeout=timeout,
            )
        items = tuple((str(v.name), {"state": v.state.name}) for v in pager.versions)
        await charge(answer_size(items))
        return Listing(items, str(pager.next_page_token))

    async def close(self) -> None:
        channels = [channel for channel, _ in self._clients.values()]
        channels += [channel for _, channel in self._retired]
        self._clients, self._retired = OrderedDict(), []
        for channel in channels:
            await channel.close()


def proxy_options(proxies: Proxies, endpoint: str) -> list[tuple[str, str | int]]:
    """The channel arguments that send a channel to `endpoint` (host:port) through the proxy
    `proxies` chooses, or straight to it. A gRPC target is treated as an https origin (grpc-go
    does the same), so HTTPS_PROXY applies; the tunnel is a CONNECT either way. Without any
    proxy variable set, gRPC is left to its own settings (e.g. its grpc_proxy variable)."""
    if not proxies:
        return []
    proxy = proxies.for_url(f"https://{endpoint}")
    if proxy is None:
        return [("grpc.enable_http_proxy", 0)]
    # The configured URL: gRPC sends its user:password as Proxy-Authorization itself.
    return [("grpc.http_proxy", proxy.configured)]
