"""Reads of one Key Vault as one identity, and the one place Azure SDK errors are translated.

Each read is one GET (or one version listing) through the SDK's aio clients, retried by
`retry_transient` only; the SDK's own retry policy is off (`retry_total=0`) so a throttled vault
sees our bounded, Retry-After-honouring retries and not those multiplied by the SDK's.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from backends.azure import certs
from backends.azure.auth import AssertionSource, CheckedCredential
from backends.azure.objects import AzureRef
from backends.azure.selectors import AzureSelection
from backends.clouds.azure import EntraUnavailable
from provider.core.backend import BackendEnv
from provider.core.errors import (
    BridgeError,
    DeadlineExceeded,
    InvalidParameters,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
    redacted,
    scrub,
)
from provider.core.model import FetchContext, Identity, SecretValue

log = logging.getLogger("secrets_bridge.azure")
T = TypeVar("T")
PFX = "application/x-pkcs12"
PEM = "application/x-pem-file"
_ROLE = {
    "secret": "Key Vault Secrets User",
    "key": "Key Vault Crypto User",
    "cert": "Key Vault Certificate User",
}

#: The SDK method listing one object's versions, per object type.
_LIST_VERSIONS = {
    "secret": "list_properties_of_secret_versions",
    "key": "list_properties_of_key_versions",
    "cert": "list_properties_of_certificate_versions",
}
#: Secrets per page of a vault listing (Key Vault's default and largest page).
PAGE_SIZE = 25


@dataclass
class VaultSession:
    """Credential and clients of one identity key, shared by every Mount with that key."""

    vault_name: str
    vault_url: str
    credential: CheckedCredential
    #: Builds the SDK client of one object type ("secret", "key", "cert") over `credential`.
    build_client: Callable[[str], Awaitable[Any]]
    #: The latest pod token of this identity, read by the credential when it logs in again.
    assertion: AssertionSource
    _clients: dict[str, Any] = field(default_factory=dict)

    async def client(self, object_type: str) -> Any:
        """The client for `object_type`, built on first use: most identities read only secrets,
        and each SDK package and client pipeline costs memory for as long as the process lives."""
        client = self._clients.get(object_type)
        if client is None:
            built = await self.build_client(object_type)
            client = self._clients.setdefault(object_type, built)
            if client is not built:  # a concurrent read built it first
                await built.close()
        return client

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
        await self.credential.close()


class VaultReader:
    """Reads refs for one Mount: retries, deadline, metrics and error translation around each."""

    def __init__(
        self, session: VaultSession, identity: Identity, ctx: FetchContext, env: BackendEnv[Any]
    ) -> None:
        self._s, self._identity, self._ctx, self._env = session, identity, ctx, env

    async def read(self, ref: AzureRef) -> list[SecretValue]:
        # Built (on first use, an SDK import) before any call's timeout starts.
        client = await self._s.client(ref.object_type)
        if not ref.history:
            value = await self._call(ref, "get", lambda: self._one(client, ref, ref.version))
            return [self._decoded(ref, value)]
        versions = await self._call(ref, "list_versions", lambda: self._versions(client, ref))
        values = []
        for i, version in enumerate(versions):
            value = await self._call(ref, "get", partial(self._one, client, ref, version))
            values.append(
                replace(
                    self._decoded(ref, value),
                    suffix=str(i),
                    version_id=f"{ref.object_type}/{ref.name}/{i}",
                )
            )
        return values

    def _decoded(self, ref: AzureRef, value: SecretValue) -> SecretValue:
        """objectEncoding applied to the secret as read: the content changes, the version (Key
        Vault's version id, what upstream reports) stays. The value is never quoted."""
        if ref.encoding is None:
            return value
        data = b"".join(value.content.split())
        try:
            if ref.encoding == "base64":
                content = base64.b64decode(data, validate=True)
            else:
                content = binascii.unhexlify(data)
        except (binascii.Error, ValueError):
            raise InvalidParameters(
                f"{self.where(ref)}: the value is not valid {ref.encoding} (objectEncoding "
                f"{ref.encoding}); remove objectEncoding or store the value "
                f"{ref.encoding}-encoded"
            ) from None
        return replace(value, content=content)

    async def _one(self, client: Any, ref: AzureRef, version: str) -> SecretValue:
        if ref.object_type == "key":
            key = await client.get_key(ref.name, version or None)
            return SecretValue(certs.public_key_pem(key.key), version=key.properties.version)
        if ref.object_type == "cert":
            if version:
                cert = await client.get_certificate_version(ref.name, version)
            else:
                cert = await client.get_certificate(ref.name)
            return SecretValue(
                certs.cert_pem(bytes(cert.cer or b"")), version=cert.properties.version
            )
        secret = await client.get_secret(ref.name, version or None)
        return SecretValue(_secret_content(ref, secret), version=secret.properties.version)

    async def _versions(self, client: Any, ref: AzureRef) -> list[str]:
        """Enabled versions, newest first, from objectVersion when set, at most `history`."""
        lister = getattr(client, _LIST_VERSIONS[ref.object_type])
        found = [(p.created_on, p.version) async for p in lister(ref.name) if p.enabled]
        epoch = datetime.min.replace(tzinfo=UTC)
        found.sort(key=lambda cv: cv[0] or epoch, reverse=True)
        ordered = [v for _, v in found]
        if ref.version:
            if ref.version not in ordered:
                raise NotFound(self.where(ref) + f" has no enabled version {ref.version!r}")
            ordered = ordered[ordered.index(ref.version) :]
        if not ordered:
            raise NotFound(self.where(ref) + " has no enabled versions")
        return ordered[: ref.history]

    async def list_page(
        self, selection: AzureSelection, link: str | None
    ) -> tuple[list[Any], str | None]:
        """One page of the vault's secrets (their properties: no values), from the start or
        from a page's `nextLink`, and the next page's link (None at the end). One page per call
        so that each is retried alone and the caller bounds how many it reads."""
        client = await self._s.client("secret")

        async def page() -> tuple[list[Any], str | None]:
            pages = client.list_properties_of_secrets(max_page_size=PAGE_SIZE).by_page(link)
            items = [p async for p in await anext(pages)]
            return items, pages.continuation_token

        async def attempt() -> tuple[list[Any], str | None]:
            with self._env.metrics.backend_call("azure", "secret.list"):
                async with self._translated(selection):
                    return await page()

        return await self._env.retry(attempt, self._ctx)

    async def _call(self, ref: AzureRef, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        async def attempt() -> T:
            with self._env.metrics.backend_call("azure", f"{ref.object_type}.{operation}"):
                async with self._translated(ref):
                    return await call()

        return await self._env.retry(attempt, self._ctx)

    @property
    def vault_url(self) -> str:
        return self._s.vault_url

    def where(self, ref: AzureRef | AzureSelection) -> str:
        if isinstance(ref, AzureSelection):
            return f"Key Vault {self._s.vault_name}: {ref.describe()}"
        version = f" (version {ref.version})" if ref.version else ""
        return f"Key Vault {self._s.vault_name}: {ref.object_type} {ref.name!r}{version}"

    @asynccontextmanager
    async def _translated(self, ref: AzureRef | AzureSelection) -> AsyncIterator[None]:
        """THE translation of Azure SDK exceptions into provider errors for this backend."""
        from azure.core.exceptions import (
            AzureError,
            DecodeError,
            HttpResponseError,
            ServiceRequestError,
        )

        try:
            async with asyncio.timeout(max(0.0, self._ctx.deadline - time.monotonic())):
                yield
        except EntraUnavailable as exc:
            raise StoreUnavailable(f"{self.where(ref)}: {exc}") from None
        except BridgeError:
            raise
        except TimeoutError:
            raise DeadlineExceeded(self.where(ref) + ": the Mount's deadline passed") from None
        except certs.ConversionError as exc:
            raise InvalidParameters(f"{self.where(ref)}: {exc}") from None
        except DecodeError:
            # 200 with a body that is not Key Vault's JSON: a proxy or captive portal in between.
            raise StoreUnavailable(
                f"{self.where(ref)}: the answer was not Key Vault JSON"
            ) from None
        except HttpResponseError as exc:
            raise self._http_error(ref, exc) from None
        except ServiceRequestError as exc:
            raise StoreUnavailable(f"{self.where(ref)}: unreachable: {scrub(exc)}") from None
        except AzureError as exc:
            raise StoreUnavailable(f"{self.where(ref)}: {scrub(exc)}") from None
        except ValueError as exc:
            # The SDK refuses to send a token to a vault whose 401 challenge names a resource
            # outside the vault's domain (a spoofed or misrouted endpoint).
            raise PermissionDenied(
                f"{self.where(ref)}: refused to authenticate to {self._s.vault_url}: "
                f"{scrub(str(exc).split('. Pass')[0])}; check cloudName and the vault DNS suffix"
            ) from None

    def _http_error(self, ref: AzureRef | AzureSelection, exc: Any) -> BridgeError:
        status = exc.status_code or 0
        where, who = self.where(ref), self._identity.subject
        text = f"{status} {error_codes(exc)}".strip()
        if isinstance(ref, AzureSelection):
            return self._listing_error(where, who, text, exc) or self._status_error(
                where, text, exc
            )
        if status == 404:
            return NotFound(f"{where} does not exist ({text}); check objectName and objectType")
        if status in (401, 403):
            return PermissionDenied(
                f"{where}: {who} may not read it ({text}); grant the pod's identity "
                f"the {_ROLE[ref.object_type]} role on the vault, or the matching access policy"
                + ("; version history also needs list permission" if ref.history else "")
            )
        return self._status_error(where, text, exc)

    def _listing_error(self, where: str, who: str, text: str, exc: Any) -> BridgeError | None:
        status = exc.status_code or 0
        if status in (401, 403):
            return PermissionDenied(
                f"{where}: {who} may not list the vault's secrets ({text}); grant the pod's "
                "identity the Key Vault Secrets User role on the vault (it allows list and get), "
                "or an access policy with secret list and get"
            )
        if 400 <= status < 500 and status != 429:
            # Never NotFound: an optional selector would then be an empty one.
            return InvalidParameters(f"{where}: Key Vault refused the listing ({text})")
        return None

    def _status_error(self, where: str, text: str, exc: Any) -> BridgeError:
        """Redirects, throttling, outages and other refusals, the same for every call."""
        status = exc.status_code or 0
        if 300 <= status < 400:
            error = StoreUnavailable(
                f"{where}: {self._s.vault_url} answered {status}, a redirect, which "
                "secrets-bridge does not follow (it would take the read elsewhere); check "
                "cloudName and the vault name"
            )
            error.transient = False
            return error
        if status == 429 or status >= 500:
            retry_after = _retry_after(exc.response) if status == 429 else None
            return StoreUnavailable(
                f"{where}: Key Vault answered {status}", retry_after=retry_after
            )
        return InvalidParameters(f"{where}: Key Vault refused the request ({text})")


def error_codes(exc: Any) -> str:
    """`Forbidden/AccessDenied`: Key Vault's known error codes in an error answer, never its
    message (free text that may echo the request); that goes to a DEBUG line, redacted."""
    status = getattr(exc, "status_code", None) or 0
    codes: list[str] = []
    error = getattr(exc, "error", None)
    while error is not None and len(codes) < 4:
        code = getattr(error, "code", None)
        if isinstance(code, str) and code in KNOWN_CODES:
            codes.append(code)
        error = getattr(error, "innererror", None) or getattr(error, "inner_error", None)
        if isinstance(error, dict):
            error = _Inner(error.get("code"), error.get("innererror"))
    log.debug(
        "Key Vault answered %s (not relayed): %s", status, redacted(getattr(exc, "message", ""))
    )
    return "/".join(codes)


@dataclass(frozen=True)
class _Inner:
    code: object
    innererror: object


#: Key Vault's documented error codes (and inner codes) reported by name.
KNOWN_CODES = frozenset(
    {
        "BadParameter",
        "Unauthorized",
        "Forbidden",
        "AccessDenied",
        "ForbiddenByPolicy",
        "ForbiddenByRbac",
        "ForbiddenByFirewall",
        "ForbiddenByConnection",
        "SecretNotFound",
        "KeyNotFound",
        "CertificateNotFound",
        "VaultNotFound",
        "ObjectIsBeingDeleted",
        "ObjectIsDeletedButRecoverable",
        "SecretDisabled",
        "KeyDisabled",
        "CertificateDisabled",
        "Throttled",
        "ServiceUnavailable",
        "InternalServerError",
        "NotSupported",
        "Conflict",
        "InvalidRequest",
    }
)


def _secret_content(ref: AzureRef, secret: Any) -> bytes:
    value: str = secret.value or ""
    props = secret.properties
    # A certificate's secret (it has a key id): PEM-stored ones are written as stored; PFX-stored
    # ones become key + ordered chain PEM, unless objectFormat asked for the PFX itself.
    if props.key_id and props.content_type == PFX and not ref.pfx:
        return certs.pfx_to_pem(value)
    return value.encode()


def _retry_after(response: Any) -> float | None:
    headers = getattr(response, "headers", None) or {}
    millis = headers.get("x-ms-retry-after-ms") or headers.get("retry-after-ms")
    try:
        if millis:
            return max(0.0, float(millis) / 1000)
        raw = headers.get("Retry-After")
        if not raw:
            return None
        if raw.strip().isdigit():
            return float(raw)
        when = email.utils.parsedate_to_datetime(raw)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None
