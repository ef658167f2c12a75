"""The one place where Google's exceptions become secrets-bridge errors.

Three libraries can fail under the gcp backend: the Secret Manager client (google-api-core
exceptions over gRPC status codes), aiohttp (the STS and IAM credentials calls) and google-auth
(node credentials and service account keys). `translated()` wraps every such call; HTTP error
answers from STS/IAM become errors in `http_error()`. Messages name the operation, the resource,
the pod's identity and what to fix, and carry only scrubbed store text.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import grpc
from google.api_core import exceptions as api
from google.auth import exceptions as auth

from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    MissingCredential,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
    scrub,
)

ACCESSOR_FIX = "grant roles/secretmanager.secretAccessor on the secret to the pod's Google identity"


class TokenRejected(PermissionDenied):
    """Secret Manager did not accept the access token (UNAUTHENTICATED): worth one re-login."""


_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
}


def rpc_error(code: grpc.StatusCode | None, text: str, name: str, subject: str) -> BridgeError:
    """A Secret Manager status for resource `name`, read as `subject`."""
    label = code.name if code is not None else "UNKNOWN"
    detail = f"({label}: {scrub(text)})"
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(
            f"Secret Manager denied {subject} access to {name} {detail}; {ACCESSOR_FIX}"
        )
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return TokenRejected(
            f"Secret Manager rejected the access token of {subject} reading {name} {detail}"
        )
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(
            f"secret version {name} was not found reading as {subject} {detail}; check the "
            "project, secret and version in resourceName"
        )
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return NotFound(
            f"secret version {name} cannot be read as {subject} {detail}; it is probably "
            "disabled or destroyed: enable it or name another version"
        )
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidParameters(f"Secret Manager refused the name {name} (as {subject}) {detail}")
    if code in _TRANSIENT:
        return StoreUnavailable(
            f"Secret Manager is unavailable reading {name} as {subject} {detail}"
        )
    return StoreUnavailable(f"Secret Manager failed reading {name} as {subject} {detail}")


def http_error(status: int, body: str, what: str, fix: str, retry_after: str | None) -> BridgeError:
    """An error answer of STS or IAM credentials (`what` names the call and the identity)."""
    detail = f"(HTTP {status}: {scrub(body)})"
    if status == 429 or status >= 500:
        return StoreUnavailable(f"{what} failed {detail}", retry_after=_seconds(retry_after))
    if status in (400, 401, 403, 404):
        return PermissionDenied(f"{what} was refused {detail}; {fix}")
    return StoreUnavailable(f"{what} failed {detail}")


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


@contextmanager
def translated(what: str, subject: str) -> Iterator[None]:
    """Let BridgeErrors through; turn every library failure into one (`what`: the call)."""
    try:
        yield
    except BridgeError:
        raise
    except api.GoogleAPICallError as exc:
        raise rpc_error(exc.grpc_status_code, exc.message, what, subject) from exc
    except grpc.aio.AioRpcError as exc:
        raise rpc_error(exc.code(), exc.details() or "", what, subject) from exc
    except api.GoogleAPIError as exc:
        raise StoreUnavailable(f"Secret Manager failed reading {what} ({scrub(exc)})") from exc
    except auth.DefaultCredentialsError as exc:
        raise MissingCredential(
            f"{what}: the provider has no Application Default Credentials ({scrub(exc)}); "
            "give the provider's ServiceAccount a Google identity, or use auth pod-adc"
        ) from exc
    except auth.RefreshError as exc:
        raise PermissionDenied(f"{what} for {subject} was refused ({scrub(exc)})") from exc
    except (TimeoutError, auth.TransportError, aiohttp.ClientError, OSError) as exc:
        raise StoreUnavailable(f"{what}: cannot reach Google ({type(exc).__name__})") from exc
    except (auth.GoogleAuthError, ValueError) as exc:
        raise InvalidParameters(
            f"{what} for {subject}: unusable credentials ({scrub(exc)})"
        ) from exc
