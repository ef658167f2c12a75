"""The one place where botocore/aiohttp exceptions become secrets-bridge errors.

Every AWS call runs inside `translated(...)`; nothing from the SDK escapes it. The AWS error
code decides the class, because HTTP statuses overlap (SSM answers 400 both for a missing
parameter and for throttling). Messages carry the caller's description of the call (object,
region, identity), the AWS error code and the HTTP status — never AWS's message, which is free
text that may echo request input; it goes to a DEBUG line, redacted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    MissingCredential,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
    redacted,
    scrub,
)

log = logging.getLogger("secrets_bridge.aws")

DENIED = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "AuthorizationError",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "InvalidIdentityToken",
        "IDPRejectedClaim",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "MissingAuthenticationToken",
        "KMSAccessDeniedException",
        "DecryptionFailure",
        "InvalidKeyId",
    }
)
MISSING = frozenset(
    {
        "ResourceNotFoundException",
        "ParameterNotFound",
        "ParameterVersionNotFound",
        "ParameterVersionLabelNotFound",
    }
)
TRANSIENT = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalFailure",
        "InternalServiceError",
        "InternalServerError",
        "IDPCommunicationError",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
#: Codes meaning the credentials themselves went stale (one re-login helps).
STALE_CREDENTIALS = frozenset({"ExpiredToken", "ExpiredTokenException"})


class AwsDenied(PermissionDenied):
    """A refusal that carries the AWS error code (callers tell stale credentials apart)."""

    def __init__(self, message: str, aws_code: str) -> None:
        super().__init__(message)
        self.aws_code = aws_code


@contextmanager
def translated(what: str, hint: str = "") -> Iterator[None]:
    """Run an AWS call; re-raise any failure as a BridgeError describing `what`.

    `hint` is appended to refusals: what to grant, to whom.
    """
    try:
        yield
    except (BridgeError, asyncio.CancelledError):
        raise
    except Exception as exc:  # the one place SDK exceptions end
        raise translate(exc, what, hint) from None


def translate(exc: Exception, what: str, hint: str = "") -> BridgeError:
    from botocore import exceptions as bx

    if isinstance(exc, bx.ClientError):
        return _client_error(exc.response, what, hint)
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return MissingCredential(
            f"{what}: the provider has no AWS credentials of its own for node identity "
            "(set roleArn, the ServiceAccount's eks.amazonaws.com/role-arn annotation, or "
            "usePodIdentity)"
        )
    if isinstance(exc, bx.ParamValidationError):
        return InvalidParameters(f"{what}: AWS refuses the request: {scrub(exc)}")
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return StoreUnavailable(f"{what}: no answer in time")
    if isinstance(exc, bx.HTTPClientError | bx.ConnectionError | OSError):
        # Connection-level errors: their text is a URL and an errno, never a payload.
        return StoreUnavailable(f"{what}: AWS unreachable: {type(exc).__name__}: {scrub(exc)}")
    # Anything else (a garbled answer, a parser error) may quote the response body, which for
    # a read holds the secret: only the type goes into the message.
    if isinstance(exc, bx.BotoCoreError | _ResponseParserError()) or _is_aiohttp(exc):
        return StoreUnavailable(f"{what}: unusable answer from AWS ({type(exc).__name__})")
    return BridgeError(f"{what}: unexpected {type(exc).__name__}")


def answered(code: str, what: str, hint: str = "") -> BridgeError:
    """The error of one item of a batch answer that carries its own AWS error code
    (BatchGetSecretValue's `Errors`), as a whole call failing with that code would be."""
    return _client_error({"Error": {"Code": code}, "ResponseMetadata": {}}, what, hint)


def _client_error(response: Any, what: str, hint: str) -> BridgeError:
    error = response.get("Error") or {}
    meta = response.get("ResponseMetadata") or {}
    code = str(error.get("Code") or "")
    status = int(meta.get("HTTPStatusCode") or 0)
    # The code is AWS's identifier (or a registry's, for an emulator): report it only when it
    # looks like one, so a free-text code cannot carry anything into the event.
    known = code if code.isascii() and code.isalnum() and len(code) <= 64 else ""
    detail = f"{known or 'HTTP ' + str(status)}"
    log.debug(
        "AWS answered %s %s (not relayed): %s", status, known, redacted(error.get("Message") or "")
    )
    if code in DENIED:
        return AwsDenied(f"{what}: denied ({detail}){hint}", code)
    if code in MISSING:
        return NotFound(f"{what}: not found ({detail}); check objectName, objectType and region")
    if code in TRANSIENT or status == 429 or status >= 500:
        retry_after = _retry_after(meta.get("HTTPHeaders") or {})
        return StoreUnavailable(f"{what}: AWS unavailable ({detail})", retry_after=retry_after)
    if status in (401, 403):
        return AwsDenied(f"{what}: denied ({detail}){hint}", code)
    if status == 404:
        return NotFound(f"{what}: not found ({detail})")
    return InvalidParameters(f"{what}: AWS refused the request ({detail})")


def _retry_after(headers: Any) -> float | None:
    value = headers.get("retry-after") if hasattr(headers, "get") else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def _ResponseParserError() -> type[Exception]:
    from botocore.parsers import ResponseParserError

    parser_error: type[Exception] = ResponseParserError
    return parser_error


def _is_aiohttp(exc: Exception) -> bool:
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiobotocore depends on it
        return False
    return isinstance(exc, aiohttp.ClientError)
