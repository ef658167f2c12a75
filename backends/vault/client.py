"""Vault's HTTP API over aiohttp: one session per (origin, TLS settings), reused by every pod.

We talk to the API directly instead of running hvac in threads: every call here is one small
JSON request, hvac would add a thread hop per call and a thread per concurrent read, and aiohttp
is already a dependency of the provider (see the measurement in the backend's report/tests).

This module is the one place where transport failures (aiohttp, ssl, OS errors, timeouts) become
BridgeErrors. HTTP statuses are turned into errors by `status_error`, which callers give the
context (what was being done, by whom) that makes the message actionable.

The address comes from the class, so the server may be anyone's (backends/wire.py): bodies are
capped, redirects are refused (one would carry the Vault token or the pod's login to another
host), sessions are bounded and keyed by origin, not by address, and an error answer is reported
by status and Vault's known messages only — its body goes to a DEBUG line, redacted.

Calls honour HTTPS_PROXY / HTTP_PROXY / NO_PROXY (backends/wire.py `Proxies`, read when the
backend is built): through a proxy, `vaultTLSServerName` and the class's CA still apply to the
TLS session with Vault inside the CONNECT tunnel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yarl

from backends import nodefiles
from backends.proxies import Proxies, proxied_requests, proxy_failure
from backends.vault.dialect import TLSConfig
from backends.wire import (
    MAX_SESSIONS,
    MAX_SMALL_BODY,
    Charge,
    Resolver,
    SessionPool,
    origin,
    read_capped,
)
from provider.core.calls import attempt_cutoff
from provider.core.errors import (
    BridgeError,
    DeadlineExceeded,
    InvalidParameters,
    NotFound,
    PermissionDenied,
    StoreSilent,
    StoreUnavailable,
    known_phrases,
    redacted,
    scrub,
)

log = logging.getLogger("secrets_bridge.vault")

#: Statuses worth retrying: throttled, sealed/standby (503), other server-side failures, and
#: 412 (a performance standby has not caught up with a write yet).
_TRANSIENT = frozenset({412, 429, 500, 502, 503, 504})
#: Redirects followed within the store's origin (never to another one).
_MAX_REDIRECTS = 3

#: Vault's and OpenBao's known error messages (a lower-case needle, and the phrase we report).
#: Only these phrases ever reach an error: the rest of a body is the server's free text, which
#: may echo request input or values (and the server may be anyone's).
KNOWN_ERRORS = (
    ("permission denied", "permission denied"),
    ("missing client token", "missing client token"),
    ("invalid role name", "invalid role name"),
    ("could not be found", "role could not be found"),
    ("role not found", "role could not be found"),
    ("audience", "invalid audience (aud) claim"),
    ("bound claim", "claim does not match any associated bound claim values"),
    ("invalid subject", "invalid subject (sub) claim"),
    ("invalid issuer", "invalid issuer (iss) claim"),
    ("service account name not authorized", "service account name not authorized"),
    ("namespace not authorized", "namespace not authorized"),
    ("service account unauthorized", "service account unauthorized"),
    ("expired", "token is expired"),
    ("signature", "failed to verify the token's signature"),
    ("error validating token", "error validating token"),
    ("invalid path for a versioned k/v", "Invalid path for a versioned K/V secrets engine"),
    ("no handler for route", "no handler for route"),
    ("unsupported path", "unsupported path"),
    ("missing role", "missing role"),
    ("missing jwt", "missing jwt"),
    ("vault is sealed", "Vault is sealed"),
    ("active cluster node not found", "active cluster node not found"),
    ("rate limit quota exceeded", "rate limit quota exceeded"),
    ("upgrade in progress", "upgrade in progress"),
    ("internal error", "internal error"),
    # Vault's aws method (iam type).
    ("does not belong to the role", "IAM principal does not belong to the role"),
    ("x-vault-aws-iam-server-id", "error validating the X-Vault-AWS-IAM-Server-ID header"),
    ("error making upstream request", "STS refused the signed request (upstream request)"),
    ("auth method iam not allowed", "auth method iam not allowed for the role"),
    ("entry for role", "role could not be found"),
    # Vault's gcp method (iam type): vault-plugin-auth-gcp plugin/path_login.go.
    ("is not authorized for role", "service account is not authorized for the role"),
    ("not in bound projects", "service account is not in the role's bound projects"),
    ("must end in", "the JWT's aud claim must end in vault/<role>"),
    ("jwt must expire in", "the JWT expires too late"),
    ("jwts expire within", "the JWT expires after the role's max_jwt_exp"),
    ("unable to get public key", "no public key for the JWT's signature"),
    ('" not found', "role could not be found"),
    # Vault's azure method: vault-plugin-auth-azure path_login.go, and go-oidc's verifier.
    ("service principal not authorized", "service principal not authorized"),
    ("groups not authorized", "groups not authorized"),
    ("issued by a different provider", "invalid issuer (iss) claim"),
    ("subscription not authorized", "subscription not authorized"),
    ("resource group not authorized", "resource group not authorized"),
    ("location not authorized", "location not authorized"),
    ("scale set not authorized", "scale set not authorized"),
    ("token claim does not match", "the token's xms_mirid does not match the login's resource"),
    (
        "subscription_id and resource_group_name are required",
        "subscription_id and resource_group_name are required",
    ),
    # A renewal at the max TTL: OpenBao answers HTTP 500, and asking again will not help.
    ("past the max ttl", "past the max TTL, cannot renew"),
)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = field(repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body) if self.body else {}
        except (ValueError, RecursionError):
            return {}
        return value if isinstance(value, dict) else {}

    def errors(self) -> str:
        """Vault's known error messages in its errors (or warnings), as our own phrases; the
        body itself is logged at DEBUG, redacted, and never relayed. An error answer over
        MAX_SMALL_BODY is not parsed: Vault's errors are a few lines, and parsing a hostile
        server's megabytes on the event loop would stall every tenant (issue 40, item 3)."""
        payload = self.json() if len(self.body) <= MAX_SMALL_BODY else {}
        texts = payload.get("errors") or payload.get("warnings") or []
        if not isinstance(texts, list):
            texts = [texts]
        text = "; ".join(str(t) for t in texts)
        known = known_phrases(text, KNOWN_ERRORS)
        if self.body and not 200 <= self.status < 300:
            log.debug(
                "Vault answered HTTP %s (%d bytes; not relayed): %s",
                self.status,
                len(self.body),
                redacted(text or self.body.decode(errors="replace")),
            )
        return "; ".join(known)

    def status_text(self) -> str:
        """`HTTP 403: permission denied`, or `HTTP 418` when Vault said nothing we know."""
        known = self.errors()
        return f"HTTP {self.status}: {known}" if known else f"HTTP {self.status}"


class VaultHTTP:
    """Shared HTTP sessions; `request` returns a Reply for any HTTP status."""

    def __init__(
        self, *, max_connections: int, max_body_bytes: int, request_timeout: float = 0.0
    ) -> None:
        self._max_connections = max_connections
        self._max_body = max_body_bytes
        self._request_timeout = request_timeout
        # Keyed by origin: 3,000 path suffixes of one server are one session, and 3,000
        # servers are at most MAX_SESSIONS open ones.
        self._sessions: SessionPool[tuple[tuple[str, str, int], TLSConfig]] = SessionPool(
            self._new_session, MAX_SESSIONS
        )
        self._resolver = Resolver()
        self._proxies = Proxies.from_env()
        self._request_class = proxied_requests(self._proxies)

    async def _new_session(
        self, key: tuple[tuple[str, str, int], TLSConfig]
    ) -> aiohttp.ClientSession:
        (scheme, _host, _port), tls = key
        ssl_ctx = await asyncio.to_thread(_ssl_context, tls) if scheme == "https" else None
        connector = aiohttp.TCPConnector(
            limit=self._max_connections,
            ssl=ssl_ctx if ssl_ctx else True,
            resolver=self._resolver,
        )
        return aiohttp.ClientSession(connector=connector, request_class=self._request_class)

    async def request(
        self,
        address: str,
        tls: TLSConfig,
        method: str,
        path: str,
        *,
        deadline: float,
        token: str | None = None,
        namespace: str = "",
        query: tuple[tuple[str, str], ...] = (),
        body: str = "",
        doing: str = "",
        quote: bool = False,
        charge: Charge | None = None,
    ) -> Reply:
        """One API call. `doing` (what, for whom) prefixes every error message. `quote`: the
        path is a store's own key names (a selection's listing), sent percent-encoded as they
        are, so a key holding '?', '#' or '%' names itself and not a query or an escape.
        `charge`: the fetch's bytes in flight, charged the body as it is read."""
        doing = doing or f"{method} {path}"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"{doing}: no time left before the deadline")
        # Cut where the core cuts this attempt (--store-call-timeout), or sooner with
        # --vault-request-timeout: the same outcome, but this message names the address.
        limit = min(remaining, attempt_cutoff() - time.monotonic())
        if self._request_timeout > 0:
            limit = min(limit, self._request_timeout)
        headers = {"X-Vault-Request": "true"}
        if token:
            headers["X-Vault-Token"] = token
        if namespace:
            headers["X-Vault-Namespace"] = namespace
        if body:
            headers["Content-Type"] = "application/json"
        url: str | yarl.URL = f"{address}/v1/{path}"
        if quote:
            url = yarl.URL(f"{address}/v1/{urllib.parse.quote(path, safe='/')}", encoded=True)
        try:
            async with self._sessions.lease((origin(address), tls)) as session:
                for hop in range(_MAX_REDIRECTS + 1):
                    async with session.request(
                        method,
                        url,
                        params=list(query) if hop == 0 else None,
                        data=body.encode() if body else None,
                        headers=headers,
                        # One hung request must not eat the whole Mount: past request_timeout it
                        # is a transient failure, retried while the retry budget lasts.
                        timeout=aiohttp.ClientTimeout(total=max(limit, 0.001)),
                        server_hostname=tls.server_name or None,
                        # Vault standbys without request forwarding redirect to the active node
                        # and the Go client follows; we follow only within the origin: elsewhere
                        # the redirect would carry X-Vault-Token (or the pod's JWT in a login
                        # body) to whichever host the answer names.
                        allow_redirects=False,
                    ) as resp:
                        target = _same_origin_redirect(resp, doing, address)
                        if target is None:
                            what = f"{doing}: Vault at {address}"
                            data = await read_capped(resp, self._max_body, what, charge)
                            return Reply(resp.status, data, dict(resp.headers))
                    url = target
                raise _redirect_error(doing, address, resp.status, "too many redirects")
        except BridgeError:
            raise
        except TimeoutError:
            # A hang is an outage like a refused connection, even when it ran into the
            # deadline: transient, so serve-stale applies and the driver may try again.
            raise StoreSilent(
                f"{doing}: Vault at {address} did not answer within {limit:.1f}s"
            ) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise _transport_error(doing, address, exc, self._proxies) from None

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    async def close(self) -> None:
        await self._sessions.close()
        await self._resolver.close()


def status_error(reply: Reply, doing: str, *, denied: str, not_found: str = "") -> BridgeError:
    """The error for a non-2xx reply. `denied`/`not_found` say what to check; `doing` is what
    was attempted, naming path, identity and auth settings."""
    status, why = reply.status, reply.status_text()
    if status == 403:
        return PermissionDenied(f"{doing}: Vault denied it ({why}); {denied}")
    if status == 404:
        hint = f"; {not_found}" if not_found else ""
        return NotFound(f"{doing}: not found in Vault ({why}){hint}")
    if status in _TRANSIENT:
        what = "is sealed or in standby" if status == 503 else "failed"
        return StoreUnavailable(f"{doing}: Vault {what} ({why})", retry_after=_retry_after(reply))
    if status == 400:
        return InvalidParameters(f"{doing}: Vault refused the request ({why})")
    return StoreUnavailable(f"{doing}: unexpected answer from Vault ({why})")


def _same_origin_redirect(
    resp: aiohttp.ClientResponse, doing: str, address: str
) -> yarl.URL | None:
    """Where a redirect within the store's origin goes; None for any other answer."""
    if resp.status not in (301, 302, 303, 307, 308):
        return None
    location = resp.headers.get("Location", "")
    target = resp.url.join(yarl.URL(location)) if location else None
    if resp.status == 303:  # turns the call into a GET: not a move of the same request
        raise _redirect_error(doing, address, resp.status, "to another method")
    if target is None or origin(str(target)) != origin(str(resp.url)):
        raise _redirect_error(doing, address, resp.status, "to another host")
    return target


def _redirect_error(doing: str, address: str, status: int, why: str) -> StoreUnavailable:
    error = StoreUnavailable(
        f"{doing}: Vault at {address} answered HTTP {status}, a redirect {why}, which "
        "secrets-bridge does not follow: it would carry the Vault token or the pod's login "
        "elsewhere; point vaultAddress at the active node (or a load balancer), or enable "
        "request forwarding on standbys"
    )
    error.transient = False  # the same address redirects again
    return error


def _retry_after(reply: Reply) -> float | None:
    value = reply.headers.get("Retry-After", "")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _transport_error(
    doing: str, address: str, exc: BaseException, proxies: Proxies | None = None
) -> StoreUnavailable:
    """The one translation of aiohttp / ssl / OS errors."""
    detail = f"{type(exc).__name__}: {scrub(exc)}"
    trouble = proxy_failure(exc)
    if trouble is not None:
        proxy = proxies.for_url(address) if proxies is not None else None
        error = StoreUnavailable(
            f"{doing}: Vault at {address} is reached through the proxy "
            f"{proxy or 'of the environment'}, and {trouble}; check that the proxy allows "
            "this host and port, or list the host in NO_PROXY"
        )
        # A proxy that refuses the host refuses it again; one that cannot reach it may recover.
        status = getattr(exc, "status", 0)
        error.transient = not 400 <= status < 500
        return error
    if isinstance(exc, aiohttp.ClientSSLError) or _is_tls_failure(exc):
        error = StoreUnavailable(
            f"{doing}: TLS connection to Vault at {address} failed ({detail}); check "
            "vaultCACertPath / vaultCADirectory, vaultTLSServerName and the client certificate "
            "settings"
        )
        # A certificate mismatch does not heal by retrying within this Mount.
        error.transient = False
        return error
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        return StoreUnavailable(f"{doing}: the connection to Vault at {address} broke ({detail})")
    return StoreUnavailable(
        f"{doing}: Vault at {address} is unreachable ({detail}); check vaultAddress / "
        "--vault-addr and that Vault is running"
    )


def _is_tls_failure(exc: BaseException) -> bool:
    # A handshake refused by the server (e.g. no client certificate) surfaces as an OSError
    # from the SSL layer after connecting, not as aiohttp's certificate error.
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or "[SSL:" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_PEM = "PEM certificates"


def _ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """The TLS settings of a class as an SSLContext (reads files, so it runs in a thread).

    The files are node files named by the class (backends/nodefiles.py): each is used only
    when it is a regular file under the cap, and every failure of one field, including content
    that is not a certificate, has one message, so nothing tells what exists on the node.
    """
    cadata: str | None = None
    if tls.ca_cert:
        pem = nodefiles.read_node_file(tls.ca_cert, "vaultCACertPath", holding=_PEM)
        cadata = pem.decode("ascii", errors="replace")
    if tls.ca_dir:
        nodefiles.check_node_dir(tls.ca_dir, "vaultCADirectory")
    try:
        ctx = ssl.create_default_context(cadata=cadata, capath=tls.ca_dir or None)
    except (OSError, ssl.SSLError, ValueError):
        if not tls.ca_cert:
            raise InvalidParameters(
                f"vaultCADirectory {tls.ca_dir} cannot be used: not a readable directory"
            ) from None
        raise nodefiles.unusable("vaultCACertPath", tls.ca_cert, holding=_PEM) from None
    if tls.client_cert:
        try:
            nodefiles.check_node_file(tls.client_cert, "vaultTLSClientCertPath")
            if tls.client_key:
                nodefiles.check_node_file(tls.client_key, "vaultTLSClientKeyPath")
            ctx.load_cert_chain(tls.client_cert, tls.client_key or None)
        except (InvalidParameters, OSError, ssl.SSLError, ValueError):
            # One message for the pair: which of the two failed, and why, would tell.
            raise InvalidParameters(
                f"vaultTLSClientCertPath {tls.client_cert} / vaultTLSClientKeyPath "
                f"{tls.client_key} cannot be used: not a readable regular file under "
                f"{nodefiles.MAX_NODE_FILE // 1024} KiB holding a certificate and its key"
            ) from None
    if tls.skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
