"""How a failed Google token call (STS, IAM credentials, a token endpoint) is told.

Messages name the call, the identity and what to fix (`what`, `fix`: the caller's), with the
status and Google's known error codes only (an OAuth `error`, a Google `status` such as
PERMISSION_DENIED): an answer's free text may echo request input, and a key file's token endpoint
may be anyone's, so it goes to a DEBUG line, redacted. A TLS failure names the endpoint and the
CAs it was checked against (`ca_flag`), never "cannot reach Google".
"""

from __future__ import annotations

import json
import logging
import ssl

import aiohttp
from yarl import URL

from backends.wire import OAUTH_ERRORS
from provider.core.errors import BridgeError, PermissionDenied, StoreUnavailable, redacted, scrub

log = logging.getLogger("secrets_bridge.gcp")


def http_error(status: int, body: str, what: str, fix: str, retry_after: str | None) -> BridgeError:
    """An error answer of STS, IAM credentials or a token endpoint (`what` names the call and
    the identity): the status and the known codes of the body, never the body."""
    log.debug("%s answered HTTP %s (not relayed): %s", what, status, redacted(body))
    codes = known_codes(body)
    detail = f"(HTTP {status}: {codes})" if codes else f"(HTTP {status})"
    if 300 <= status < 400:
        error = StoreUnavailable(
            f"{what} answered a redirect {detail}, which secrets-bridge does not follow: it "
            "would carry the credential to another host"
        )
        error.transient = False  # the endpoint redirects again
        return error
    if status == 429 or status >= 500:
        return StoreUnavailable(f"{what} failed {detail}", retry_after=_seconds(retry_after))
    if status in (400, 401, 403, 404):
        return PermissionDenied(f"{what} was refused {detail}; {fix}")
    return StoreUnavailable(f"{what} failed {detail}")


def known_codes(body: str) -> str:
    """`invalid_grant` or `PERMISSION_DENIED`: the known codes of a JSON error body."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(payload, dict):
        return ""
    error = payload.get("error")
    found: list[str] = []
    if isinstance(error, str) and error in OAUTH_ERRORS:
        found.append(error)
    if isinstance(error, dict) and error.get("status") in _google_statuses():
        found.append(str(error["status"]))
    return ", ".join(found)


def _google_statuses() -> frozenset[str]:
    """google.rpc.Code names, as Google's JSON errors carry them in `error.status` (imported
    only when an answer failed: Vault's logins need no gRPC otherwise)."""
    import grpc

    return frozenset(c.name for c in grpc.StatusCode)


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def wire_error(
    what: str, url: str, ca_file: str | None, ca_flag: str, exc: BaseException
) -> BridgeError:
    """A token call that got no answer: TLS (`tls_error`), else Google unreachable."""
    if is_tls_failure(exc):
        return tls_error(what, endpoint_of(url), ca_file, exc, ca_flag)
    return StoreUnavailable(f"{what}: cannot reach Google ({type(exc).__name__})")


def is_tls_failure(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, is a TLS failure (a certificate not
    trusted, a handshake refused): aiohttp's, requests' (under google-auth) or ssl's own."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError | aiohttp.ClientSSLError) or "[SSL" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def tls_error(
    what: str,
    endpoint: str,
    ca_file: str | None,
    exc: BaseException,
    ca_flag: str = "--gcp-ca-file",
) -> BridgeError:
    """A token call that failed in TLS: names the endpoint and the trust it was checked
    against (`ca_flag`), never "cannot reach Google"; not retried within the Mount."""
    reason = tls_reason(exc)
    trust = f"{ca_flag} {ca_file}" if ca_file else f"the system's CAs (no {ca_flag})"
    problem = (
        f"the TLS certificate of {endpoint} is not trusted"
        if reason.startswith("certificate")
        else f"the TLS handshake with {endpoint} failed"
    )
    error = StoreUnavailable(
        f"{what}: {problem} ({reason}), checked against {trust}; if the endpoint (or a proxy "
        f"in front of it) uses a private CA, put that CA in {ca_flag}"
    )
    error.transient = False  # a certificate does not change between retries
    return error


def tls_reason(exc: BaseException) -> str:
    """What TLS said (the certificate check's message, or the SSL error's reason)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, aiohttp.ClientConnectorCertificateError):
            seen = seen.certificate_error  # aiohttp's wrapper of the ssl error
            continue
        verify_message: object = getattr(seen, "verify_message", None)
        reason: object = getattr(seen, "reason", None)
        if isinstance(seen, ssl.SSLCertVerificationError) and verify_message:
            return f"certificate verify failed: {scrub(verify_message, 120)}"
        if isinstance(seen, ssl.SSLError) and reason:
            return f"SSL error: {scrub(reason, 120)}"
        seen = seen.__cause__ or seen.__context__
    return f"{type(exc).__name__}: {scrub(exc, 160)}"


def endpoint_of(url: str) -> str:
    """`https://host:port/path` of a token URL, for messages (no query, no credentials)."""
    try:
        parsed = URL(url)
    except ValueError:
        return "the token endpoint"
    return str(parsed.with_query(None).with_fragment(None).with_user(None))
