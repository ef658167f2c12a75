"""Vault's HTTP API over aiohttp: one session per (address, TLS settings), reused by every pod.

We talk to the API directly instead of running hvac in threads: every call here is one small
JSON request, hvac would add a thread hop per call and a thread per concurrent read, and aiohttp
is already a dependency of the provider (see the measurement in the backend's report/tests).

This module is the one place where transport failures (aiohttp, ssl, OS errors, timeouts) become
BridgeErrors. HTTP statuses are turned into errors by `status_error`, which callers give the
context (what was being done, by whom) that makes the message actionable.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from backends.vault.dialect import TLSConfig
from provider.core.errors import (
    BridgeError,
    DeadlineExceeded,
    InvalidParameters,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
    scrub,
)

#: Statuses worth retrying: throttled, sealed/standby (503), other server-side failures, and
#: 412 (a performance standby has not caught up with a write yet).
_TRANSIENT = frozenset({412, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = field(repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def json(self) -> dict[str, Any]:
        try:
            value = json.loads(self.body) if self.body else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def errors(self) -> str:
        """Vault's own error texts (scrubbed), or its warnings when it gave no errors."""
        payload = self.json()
        texts = payload.get("errors") or payload.get("warnings") or []
        if not isinstance(texts, list):
            texts = [texts]
        return scrub("; ".join(str(t) for t in texts)) or f"HTTP {self.status}"


class VaultHTTP:
    """Shared HTTP sessions; `request` returns a Reply for any HTTP status."""

    def __init__(
        self, *, max_connections: int, max_body_bytes: int, request_timeout: float = 30.0
    ) -> None:
        self._max_connections = max_connections
        self._max_body = max_body_bytes
        self._request_timeout = request_timeout
        self._sessions: dict[tuple[str, TLSConfig], aiohttp.ClientSession] = {}
        self._lock = asyncio.Lock()

    async def _session(self, address: str, tls: TLSConfig) -> aiohttp.ClientSession:
        key = (address, tls)
        session = self._sessions.get(key)
        if session is None:
            async with self._lock:
                session = self._sessions.get(key)
                if session is None:
                    ssl_ctx = (
                        await asyncio.to_thread(_ssl_context, tls) if _wants_tls(address) else None
                    )
                    connector = aiohttp.TCPConnector(
                        limit=self._max_connections, ssl=ssl_ctx if ssl_ctx else True
                    )
                    session = aiohttp.ClientSession(connector=connector)
                    self._sessions[key] = session
        return session

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
    ) -> Reply:
        """One API call. `doing` (what, for whom) prefixes every error message."""
        doing = doing or f"{method} {path}"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"{doing}: no time left before the deadline")
        headers = {"X-Vault-Request": "true"}
        if token:
            headers["X-Vault-Token"] = token
        if namespace:
            headers["X-Vault-Namespace"] = namespace
        if body:
            headers["Content-Type"] = "application/json"
        url = f"{address}/v1/{path}"
        try:
            session = await self._session(address, tls)
            async with session.request(
                method,
                url,
                params=list(query),
                data=body.encode() if body else None,
                headers=headers,
                # One hung request must not eat the whole Mount: past request_timeout it is
                # a transient failure, retried while the retry budget lasts.
                timeout=aiohttp.ClientTimeout(total=min(remaining, self._request_timeout)),
                server_hostname=tls.server_name or None,
                # Vault standbys without request forwarding redirect to the active node; the
                # Go client (and so vault-csi-provider) follows, keeping method and body.
                max_redirects=3,
            ) as resp:
                data = await self._read_body(resp, doing)
                return Reply(resp.status, data, dict(resp.headers))
        except BridgeError:
            raise
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(
                    f"{doing}: Vault at {address} did not answer before the deadline"
                ) from None
            raise StoreUnavailable(f"{doing}: Vault at {address} timed out") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise _transport_error(doing, address, exc) from None

    async def _read_body(self, resp: aiohttp.ClientResponse, doing: str) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > self._max_body:
                raise LimitExceeded(f"{doing}: Vault's answer is over {self._max_body} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()


def status_error(reply: Reply, doing: str, *, denied: str, not_found: str = "") -> BridgeError:
    """The error for a non-2xx reply. `denied`/`not_found` say what to check; `doing` is what
    was attempted, naming path, identity and auth settings."""
    status, why = reply.status, reply.errors()
    if status == 403:
        return PermissionDenied(f"{doing}: Vault denied it (HTTP 403: {why}); {denied}")
    if status == 404:
        hint = f"; {not_found}" if not_found else ""
        return NotFound(f"{doing}: not found in Vault (HTTP 404: {why}){hint}")
    if status in _TRANSIENT:
        what = "is sealed or in standby" if status == 503 else "failed"
        return StoreUnavailable(
            f"{doing}: Vault {what} (HTTP {status}: {why})", retry_after=_retry_after(reply)
        )
    if status == 400:
        return InvalidParameters(f"{doing}: Vault refused the request (HTTP 400: {why})")
    return StoreUnavailable(f"{doing}: unexpected answer from Vault (HTTP {status}: {why})")


def _retry_after(reply: Reply) -> float | None:
    value = reply.headers.get("Retry-After", "")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _transport_error(doing: str, address: str, exc: BaseException) -> StoreUnavailable:
    """The one translation of aiohttp / ssl / OS errors."""
    detail = f"{type(exc).__name__}: {scrub(exc)}"
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


def _wants_tls(address: str) -> bool:
    return address.lower().startswith("https://")


def _ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """The TLS settings of a class as an SSLContext (reads files, so it runs in a thread)."""
    try:
        ctx = ssl.create_default_context(cafile=tls.ca_cert or None, capath=tls.ca_dir or None)
        if tls.client_cert:
            ctx.load_cert_chain(tls.client_cert, tls.client_key or None)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidParameters(
            f"cannot load the TLS files named in the class (vaultCACertPath, vaultCADirectory, "
            f"vaultTLSClientCertPath/KeyPath): {scrub(exc)}"
        ) from None
    if tls.skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
