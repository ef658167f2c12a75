"""The standard proxy environment, for every store and token call (issue 33).

`Proxies`: HTTPS_PROXY, HTTP_PROXY and NO_PROXY (or their lower-case spellings), read once when
a backend is built, and applied to every store and token call as curl and Go clients do: an
https URL through HTTPS_PROXY (a CONNECT tunnel, TLS end to end with the store), an http URL
through HTTP_PROXY, a host NO_PROXY lists directly. `proxied_requests` makes an aiohttp
session follow them; gRPC channels are given the same decision (backends/gcp/client.py);
aiobotocore reads the same variables itself (Python's NO_PROXY rules: no CIDR ranges).

With a proxy, the proxy resolves the store's host name and opens the connection (the CONNECT
names the host, never an address we resolved): `Resolver` then resolves only the proxy's own
name, and whatever a class names is reached from where the proxy stands, so the proxy's rules
are what limit it; a class cannot choose between proxy and direct except by naming a host
NO_PROXY lists. Capped bodies, refused redirects and each call's time cap are unchanged: they
act on the answer, which the tunnel carries untouched, and the wait for the tunnel counts
within the call's `ClientTimeout`.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import aiohttp
from yarl import URL

from provider.core.errors import StoreUnavailable

log = logging.getLogger("secrets_bridge.wire")

#: The variables of each URL scheme, in the order read: a lower-case one that is set (even to
#: nothing, which means "no proxy") wins over its upper-case spelling, as in curl, Python (urllib,
#: requests, botocore) and gRPC, which reads only the lower-case ones.
PROXY_VARIABLES = {"https": ("https_proxy", "HTTPS_PROXY"), "http": ("http_proxy", "HTTP_PROXY")}
NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY")

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: Proxy settings already logged (each distinct one once per process).
_announced: set[str] = set()


@dataclass(frozen=True)
class Proxy:
    """One proxy: its URL without credentials, and the header that carries them."""

    url: URL
    #: The variable it came from (messages name it, never its credentials).
    variable: str
    #: `Proxy-Authorization` when the URL holds user:password.
    authorization: str = field(default="", repr=False)
    #: The URL as configured, credentials included (gRPC reads them from it).
    configured: str = field(default="", repr=False)

    @property
    def headers(self) -> dict[str, str]:
        return {"Proxy-Authorization": self.authorization} if self.authorization else {}

    def __str__(self) -> str:
        return f"{self.url} (from {self.variable})"


@dataclass(frozen=True)
class NoProxy:
    """NO_PROXY: `*`, host names and domains (a leading `.` or `*.` changes nothing: a name
    matches itself and every name under it), IP addresses and CIDR ranges, each optionally
    with a `:port` (bracket IPv6 addresses to give one). Names are never resolved to match an
    entry: `localhost` does not match 127.0.0.1, nor the other way round."""

    everything: bool = False
    names: tuple[tuple[str, int | None], ...] = ()
    networks: tuple[tuple[_Network, int | None], ...] = ()

    @classmethod
    def parse(cls, value: str) -> NoProxy:
        everything = False
        names: list[tuple[str, int | None]] = []
        networks: list[tuple[_Network, int | None]] = []
        for raw in value.replace(" ", ",").split(","):
            entry = raw.strip().lower()
            if not entry:
                continue
            if entry == "*":
                everything = True
                continue
            host, port = _host_port(entry)
            try:
                networks.append((ipaddress.ip_network(host, strict=False), port))
            except ValueError:
                name = host.removeprefix("*").lstrip(".").rstrip(".")
                if name:
                    names.append((name, port))
        return cls(everything, tuple(names), tuple(networks))

    def matches(self, host: str, port: int | None) -> bool:
        if self.everything:
            return True
        host = host.lower().strip("[]").rstrip(".")
        try:
            address = ipaddress.ip_address(host.partition("%")[0])
        except ValueError:
            return any(
                (host == name or host.endswith("." + name)) and (want is None or want == port)
                for name, want in self.names
            )
        return any(
            address in network and (want is None or want == port) for network, want in self.networks
        )


def _host_port(entry: str) -> tuple[str, int | None]:
    """`host[:port]`, `[v6][:port]`, a bare IPv6 address or a CIDR range."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        return host, int(port) if port.isdigit() else None
    if entry.count(":") > 1:  # IPv6 without brackets: no port
        return entry, None
    host, sep, port = entry.rpartition(":")
    if sep and host and port.isdigit():
        return host, int(port)
    return entry, None


class Proxies:
    """The standard proxy environment, read once (`from_env`): which proxy, if any, a URL goes
    through. A variable set to something unusable fails the calls it would carry (naming the
    variable) rather than sending them around the proxy."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._proxies: dict[str, Proxy] = {}
        self._broken: dict[str, str] = {}
        for scheme, variables in PROXY_VARIABLES.items():
            found = _first_set(environ, variables)
            if found is None or not found[1].strip():
                continue
            variable, value = found
            try:
                self._proxies[scheme] = _parse_proxy(value, variable)
            except ValueError as exc:
                self._broken[scheme] = (
                    f"{variable} in the provider's environment cannot be used ({exc}); set it "
                    "to http://HOST:PORT of a proxy that accepts CONNECT, or list the store's "
                    "host in NO_PROXY"
                )
        found = _first_set(environ, NO_PROXY_VARIABLES)
        self.no_proxy = NoProxy.parse(found[1] if found else "")

    @classmethod
    def from_env(cls) -> Proxies:
        """The process's environment now (the provider's never changes while it runs); the
        settings are logged the first time they are seen."""
        proxies = cls(os.environ)
        proxies._announce()
        return proxies

    def __bool__(self) -> bool:
        return bool(self._proxies or self._broken)

    @property
    def hosts(self) -> frozenset[str]:
        """The proxies' own host names (connections to them are never redirected)."""
        return frozenset((p.url.host or "").lower() for p in self._proxies.values())

    def for_url(self, url: str | URL) -> Proxy | None:
        """The proxy `url` goes through; None for a direct connection. StoreUnavailable when
        the variable that applies is unusable."""
        if not self:
            return None
        target = url if isinstance(url, URL) else URL(url)
        scheme = target.scheme.lower()
        if scheme not in self._proxies and scheme not in self._broken:
            return None
        if target.host is None or self.no_proxy.matches(target.host, target.port):
            return None
        if scheme in self._broken:
            error = StoreUnavailable(self._broken[scheme])
            error.transient = False
            raise error
        return self._proxies[scheme]

    def _announce(self) -> None:
        if not self:
            return
        parts = [f"{scheme} URLs through {proxy}" for scheme, proxy in self._proxies.items()]
        parts += [f"{scheme} URLs: {why}" for scheme, why in self._broken.items()]
        text = "; ".join(parts)
        if text not in _announced:
            _announced.add(text)
            level = logging.WARNING if self._broken else logging.INFO
            log.log(level, "store calls honour the proxy environment: %s", text)


def _first_set(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = environ.get(name)
        if value is not None:
            return name, value
    return None


def _parse_proxy(value: str, variable: str) -> Proxy:
    text = value.strip()
    if "://" not in text:
        text = f"http://{text}"  # host:port, as curl and Go read it
    try:
        url = URL(text)
        url.port  # noqa: B018 (a port that is not a number fails here)
    except ValueError:
        raise ValueError("not a URL") from None  # its text may hold the credentials
    if url.scheme.lower() != "http":
        raise ValueError(
            f"{url.scheme}:// proxies are not supported, only http:// ones, which tunnel https "
            "with CONNECT"
        )
    if not url.host:
        raise ValueError("no proxy host")
    authorization = ""
    if url.user is not None:
        pair = f"{unquote(url.raw_user or '')}:{unquote(url.raw_password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    clean = URL.build(scheme="http", host=url.host, port=url.port)
    return Proxy(clean, variable, authorization, text)


def proxied_requests(proxies: Proxies) -> type[aiohttp.ClientRequest]:
    """A request class for `aiohttp.ClientSession(request_class=...)`: each request goes
    through the proxy `proxies` chooses for its URL, unless the caller names one. (A session's
    `trust_env=True` would instead read the environment and ~/.netrc at every request, on the
    loop's default executor, and may add netrc credentials for the host a class names.)"""
    if not proxies:
        return aiohttp.ClientRequest

    class ProxiedRequest(aiohttp.ClientRequest):
        def update_proxy(
            self,
            proxy: URL | None,
            proxy_auth: aiohttp.BasicAuth | None,
            proxy_headers: Any,
        ) -> None:
            if proxy is None:
                chosen = proxies.for_url(self.url)
                if chosen is not None:
                    proxy, proxy_auth, proxy_headers = chosen.url, None, chosen.headers or None
            super().update_proxy(proxy, proxy_auth, proxy_headers)

    return ProxiedRequest


def proxy_failure(exc: BaseException) -> str | None:
    """What went wrong at the proxy, for a message; None when `exc` is no proxy failure."""
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return f"the proxy answered HTTP {exc.status} to the tunnel request"
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return "the proxy cannot be reached"
    return None
