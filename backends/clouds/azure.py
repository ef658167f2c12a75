"""Azure workload identity: the pod's token for a Microsoft Entra access token.

The pod's `api://AzureADTokenExchange` token is the client assertion of an application (or
managed identity) federated with the pod's service account (workload identity federation):
azure-identity's ClientAssertionCredential posts it to the tenant's token endpoint at the
authority host. The azure store logs in this way (workload identity, and identity binding over
its token proxy), and so does Vault's azure login; both tell Entra's failures the same way here:
unreachable or failing (429, 5xx: `EntraUnavailable`, worth a retry) or refused, named by
Entra's error codes only (`entra_codes`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from backends.clouds.names import AZURE_AUDIENCE
from backends.wire import OAUTH_ERRORS
from provider.core.errors import StoreUnavailable, redacted, scrub

AUDIENCE = AZURE_AUDIENCE
log = logging.getLogger("secrets_bridge.azure")

_AADSTS = re.compile(r"\bAADSTS\d{4,6}\b")
_OAUTH = re.compile(r"\b[a-z]+(?:_[a-z]+)+\b")


class EntraUnavailable(StoreUnavailable):
    """Entra unreachable or failing; the azure store's client.py adds the vault and object."""


def assertion_credential(
    tenant_id: str,
    client_id: str,
    assertion: Callable[[], str],
    transport: Any,
    authority: str | None = None,
) -> Any:
    """azure-identity's credential that logs in with `assertion()` (the newest pod token), over
    the SDK `transport`. `authority`: Entra's host, None for azure-identity's own choice
    (AZURE_AUTHORITY_HOST, else the public cloud)."""
    from azure.identity.aio import ClientAssertionCredential

    # One try per token request: the caller's retries own retrying, so they don't multiply.
    options: dict[str, Any] = {"transport": transport, "retry_total": 0}
    if authority is not None:
        options.update(authority=authority, disable_instance_discovery=True)
    return ClientAssertionCredential(tenant_id, client_id, assertion, **options)


def outage(exc: Exception, via: str) -> EntraUnavailable | None:
    """The failure of an azure-identity call when Entra (`via`: who answered) was unreachable
    or failing (429, 5xx); None when it refused the login."""
    from azure.core.exceptions import ServiceRequestError

    if isinstance(exc, ServiceRequestError):
        return EntraUnavailable(f"{via} unreachable: {scrub(exc)}")
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None) if response is not None else None
    if isinstance(status, int) and (status == 429 or status >= 500):
        return EntraUnavailable(f"{via} answered {status}")
    return None


def entra_codes(exc: Exception) -> str:
    """Entra's error codes in a refusal (`invalid_client, AADSTS7000215`: each documented by
    Microsoft), never its description, which goes to a DEBUG line, redacted."""
    text = str(getattr(exc, "message", "") or exc)
    log.debug("Microsoft Entra refused a login (not relayed): %s", redacted(text))
    oauth = [c for c in dict.fromkeys(_OAUTH.findall(text)) if c in OAUTH_ERRORS]
    codes = oauth[:2] + list(dict.fromkeys(_AADSTS.findall(text)))[:3]
    return ", ".join(codes) or "no error code given"
