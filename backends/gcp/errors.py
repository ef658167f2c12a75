"""The one place where Google's exceptions become secrets-bridge errors.

Three libraries can fail under the gcp backend: the Secret Manager client (google-api-core
exceptions over gRPC status codes), aiohttp (the STS and IAM credentials calls) and google-auth
(node credentials and service account keys). `translated()` wraps every such call; HTTP error
answers from STS/IAM and token endpoints become errors in backends/clouds/gcp_errors.py (shared
with Vault's gcp login), which also tells TLS failures apart. Messages name the operation, the
resource, the pod's identity and what to fix, with the status and Google's known error codes
only (an OAuth `error`, a Google `status` such as PERMISSION_DENIED): an answer's free text may
echo request input, and a key file's token endpoint may be anyone's, so it goes to a DEBUG line,
redacted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp
import grpc
from google.api_core import exceptions as api
from google.auth import exceptions as auth

from backends.clouds.gcp_errors import is_tls_failure, tls_reason
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

log = logging.getLogger("secrets_bridge.gcp")

ACCESSOR_FIX = "grant roles/secretmanager.secretAccessor on the secret to the pod's Google identity"


@dataclass(frozen=True)
class Service:
    """How messages name a Google service, what it serves and the fix for a denial."""

    name: str
    noun: str
    fix: str


SECRET_MANAGER = Service("Secret Manager", "secret version", ACCESSOR_FIX)
#: The listings of a selector (backends/gcp/selecting.py): secrets of a project, a secret's
#: versions.
SECRET_LISTING = Service(
    "Secret Manager",
    "secret listing",
    "a selector lists the project's secrets and their versions: grant roles/secretmanager.viewer "
    "on the project (and roles/secretmanager.secretAccessor on the secrets) to the pod's Google "
    "identity",
)
PARAMETER_MANAGER = Service(
    "Parameter Manager",
    "parameter version",
    "grant roles/parametermanager.parameterViewer on the parameter to the pod's Google "
    "identity (secrets it references are read by the parameter's own service identity, which "
    "needs roles/secretmanager.secretAccessor on them)",
)


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


#: What gRPC core writes into an UNAVAILABLE status's details when TLS failed (its casing
#: changed across versions), and when the reason was the server's certificate.
_GRPC_TLS = ("tls handshake failed", "ssl handshake failed")
_GRPC_CERTIFICATE = (
    "certificate_verify_failed",
    "certificate verify failed",
    "unable to get local issuer certificate",
    "self signed certificate",
    "self-signed certificate",
    "certificate has expired",
)


def rpc_error(
    code: grpc.StatusCode | None,
    text: str,
    name: str,
    subject: str,
    service: Service = SECRET_MANAGER,
) -> BridgeError:
    """A Secret Manager (or Parameter Manager) status for resource `name`, read as `subject`."""
    label = code.name if code is not None else "UNKNOWN"
    svc, noun = service.name, service.noun
    # The status names the failure; the details are Google's free text (DEBUG only).
    log.debug("%s answered %s for %s (not relayed): %s", svc, label, name, redacted(text))
    detail = f"({label})"
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"{svc} denied {subject} access to {name} {detail}; {service.fix}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return TokenRejected(
            f"{svc} rejected the access token of {subject} reading {name} {detail}"
        )
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(
            f"{noun} {name} was not found reading as {subject} {detail}; check the "
            "project, name and version in resourceName"
        )
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return NotFound(
            f"{noun} {name} cannot be read as {subject} {detail}; it is probably "
            "disabled or destroyed: enable it or name another version"
        )
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidParameters(f"{svc} refused the name {name} (as {subject}) {detail}")
    lower = text.lower()
    if code == grpc.StatusCode.UNAVAILABLE and any(m in lower for m in _GRPC_TLS):
        problem = (
            "its TLS certificate is not trusted"
            if any(m in lower for m in _GRPC_CERTIFICATE)
            else "the TLS handshake failed"
        )
        error = StoreUnavailable(
            f"{svc} could not be reached reading {name} as {subject}: {problem} {detail}; if "
            "the endpoint (or a proxy in front of it) uses a private CA, put that CA in "
            "--gcp-ca-file"
        )
        error.transient = False  # a certificate does not change between retries
        return error
    if code in _TRANSIENT:
        return StoreUnavailable(f"{svc} is unavailable reading {name} as {subject} {detail}")
    return StoreUnavailable(f"{svc} failed reading {name} as {subject} {detail}")


@contextmanager
def translated(what: str, subject: str, service: Service = SECRET_MANAGER) -> Iterator[None]:
    """Let BridgeErrors through; turn every library failure into one (`what`: the call)."""
    try:
        yield
    except BridgeError:
        raise
    except api.GoogleAPICallError as exc:
        raise rpc_error(exc.grpc_status_code, exc.message, what, subject, service) from exc
    except grpc.aio.AioRpcError as exc:
        raise rpc_error(exc.code(), exc.details() or "", what, subject, service) from exc
    except api.GoogleAPIError as exc:
        raise StoreUnavailable(
            f"{service.name} failed reading {what} ({type(exc).__name__})"
        ) from exc
    except auth.DefaultCredentialsError as exc:
        raise MissingCredential(
            f"{what}: the provider has no Application Default Credentials ({scrub(exc)}); "
            "give the provider's ServiceAccount a Google identity, or use auth pod-adc"
        ) from exc
    except auth.RefreshError as exc:
        # google-auth puts the token endpoint's answer in the exception: DEBUG only.
        log.debug("%s: refresh refused (not relayed): %s", what, redacted(exc))
        raise PermissionDenied(f"{what} for {subject} was refused") from exc
    except (TimeoutError, auth.TransportError, aiohttp.ClientError, OSError) as exc:
        if is_tls_failure(exc):
            # The token calls report the endpoint and CA file themselves (tls_error).
            error = StoreUnavailable(
                f"{what}: TLS with Google failed, a certificate is not trusted or the handshake "
                f"was refused ({tls_reason(exc)}); check --gcp-ca-file, the CAs trusted for "
                "every Google endpoint"
            )
            error.transient = False
            raise error from exc
        raise StoreUnavailable(f"{what}: cannot reach Google ({type(exc).__name__})") from exc
    except (auth.GoogleAuthError, ValueError) as exc:
        raise InvalidParameters(
            f"{what} for {subject}: unusable credentials ({scrub(exc)})"
        ) from exc
