"""A selector's secrets on Secret Manager (backends/gcp/selection.py): list, mark, read.

ListSecrets carries no version, so each secret's change marker costs a call of its own: its
newest enabled version's name, from ListSecretVersions (newest first, `state:ENABLED`, one per
page). Every listed secret is then read, as the pod, with AccessSecretVersion of that exact
version (provider/core/selection.py: a listing proves leave to list, not to read). For N
secrets a poll past the class's reuse window costs ceil(N / LIST_PAGE) ListSecrets + N
ListSecretVersions + N AccessSecretVersion (docs/selectors.md). Both listings count against
Secret Manager's read quota, not the far larger access quota.

Google's `name:` filter is a substring match, so the listing can carry more than the selector
takes: each secret is checked against the prefix and labels here, and the pages are bounded
(`max_pages`) so a store that pages forever ends in a clear error.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from backends.gcp.client import Listing, Page, SecretManager
from backends.gcp.dialect import GcpRef
from backends.gcp.errors import TokenRejected
from backends.gcp.names import ID, LOCATION, SHORT_ID
from backends.gcp.options import Options
from backends.gcp.selection import GcpSelection
from provider.core.backend import BackendEnv
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    LimitExceeded,
    NotFound,
    StoreUnavailable,
)
from provider.core.model import FetchContext, Identity, SecretValue
from provider.core.selection import Listed, Selections, too_many

#: Secrets per ListSecrets page (Google allows 25,000; each secret may carry 16 KiB of
#: annotations, and a page must fit the channel's message limit).
LIST_PAGE = 100
#: Pages beyond those `limit` matching secrets need: room for names the substring filter
#: lets through and for empty pages, before the listing is refused.
SPARE_PAGES = 20
#: Pages of ListSecretVersions followed to find a secret's newest enabled version.
VERSION_PAGES = 5

_SECRET = re.compile(
    rf"projects/{ID}(?:/locations/(?P<location>{LOCATION}))?/secrets/(?P<id>{SHORT_ID})"
)
T = TypeVar("T")


def max_pages(limit: int) -> int:
    """ListSecrets pages followed for a selector of at most `limit` secrets."""
    return limit // LIST_PAGE + 1 + SPARE_PAGES


class SecretSelector:
    """Answers selection refs; `selections` reads each listed secret."""

    def __init__(
        self, env: BackendEnv[Options], secrets: SecretManager, limit: asyncio.Semaphore
    ) -> None:
        self._env = env
        self._secrets = secrets
        self._limit = limit
        self.selections = Selections()

    async def select(
        self, sel: GcpSelection, token: str, identity: Identity, ctx: FetchContext
    ) -> list[SecretValue] | BridgeError:
        subject = identity.subject
        found = await self._list(sel, token, subject, ctx)
        markers = await _settled(self._marker(name, sel, token, subject, ctx) for _, name in found)
        listed = [
            Listed(suffix, marker, GcpRef(marker, sel.location))
            for (suffix, _), marker in zip(found, markers, strict=True)
            if marker is not None
        ]

        async def read(secrets: Sequence[Listed]) -> dict[Hashable, SecretValue | BridgeError]:
            refs = [s.handle for s in secrets if isinstance(s.handle, GcpRef)]
            got = await asyncio.gather(
                *(self._access(r, token, subject, ctx) for r in refs), return_exceptions=True
            )
            return {ref: _bridge(value) for ref, value in zip(refs, got, strict=True)}

        return await self.selections.refresh(identity.key, sel, listed, read)

    async def _list(
        self, sel: GcpSelection, token: str, subject: str, ctx: FetchContext
    ) -> list[tuple[str, str]]:
        """(file name, secret name) of each secret the selector takes, in listing order."""
        found: dict[str, str] = {}
        page = Page(sel.parent, sel.location, sel.list_filter(), LIST_PAGE)
        pages, scanned = max_pages(sel.limit), 0
        for _ in range(pages):
            got = await self._list_page(page, token, subject, ctx)
            scanned += len(got.items)
            for name, labels in got.items:
                secret_id = _secret_id(name, sel)
                if sel.matches(secret_id, labels) and secret_id != sel.prefix:
                    found.setdefault(name, secret_id[len(sel.prefix) :])
            if len(found) > sel.limit:
                where = f"the selector {sel.describe()}"
                raise too_many(where, len(found), sel.limit, exact=not got.next_token)
            if not got.next_token:
                return [(suffix, name) for name, suffix in found.items()]
            page = Page(page.parent, page.location, page.filter, page.size, got.next_token)
        raise LimitExceeded(
            f"listing {sel.describe()} did not end after {pages} pages of ListSecrets "
            f"({scanned} secrets listed, {len(found)} taken): Google's name filter matches "
            "substrings; narrow the selector (a longer namePrefix, a label)"
        )

    async def _list_page(self, page: Page, token: str, subject: str, ctx: FetchContext) -> Listing:
        async def call() -> Listing:
            with self._env.metrics.backend_call("gcp", "ListSecrets"):
                return await self._secrets.list_secrets(page, token, subject, ctx.deadline)

        try:
            return await self._slot(call, ctx)
        except NotFound as exc:
            raise InvalidParameters(
                f"Secret Manager has no {page.parent} (as {subject}): check the selector's "
                "project and location"
            ) from exc

    async def _marker(
        self, name: str, sel: GcpSelection, token: str, subject: str, ctx: FetchContext
    ) -> str | None:
        """The secret's newest enabled version's name; None when the secret is gone or has no
        enabled version (nothing to mount)."""
        page = Page(name, sel.location, "state:ENABLED", 1)
        for _ in range(VERSION_PAGES):

            async def call(page: Page = page) -> Listing:
                with self._env.metrics.backend_call("gcp", "ListSecretVersions"):
                    return await self._secrets.list_versions(page, token, subject, ctx.deadline)

            try:
                got = await self._slot(call, ctx)
            except NotFound:
                return None  # deleted since the listing: the next listing drops it too
            for version, attributes in got.items:
                if not re.fullmatch(rf"{re.escape(name)}/versions/[1-9][0-9]{{0,18}}", version):
                    raise _misnamed(version, name)
                if attributes.get("state") == "ENABLED":
                    return version
            if not got.next_token:
                return None
            page = Page(name, sel.location, page.filter, 1, got.next_token)
        raise LimitExceeded(
            f"ListSecretVersions of {name} found no enabled version in {VERSION_PAGES} pages"
        )

    async def _access(
        self, ref: GcpRef, token: str, subject: str, ctx: FetchContext
    ) -> SecretValue:
        async def call() -> SecretValue:
            with self._env.metrics.backend_call("gcp", "AccessSecretVersion"):
                got = await self._secrets.access(ref, token, subject, ctx.deadline)
            return SecretValue(content=got.data, version=got.name)

        return await self._slot(call, ctx)

    async def _slot(self, call: Callable[[], Awaitable[T]], ctx: FetchContext) -> T:
        """One store call as every read makes it: in a fetch slot, retried (counted by the
        caller, one count per attempt)."""

        async def attempt() -> T:
            async with self._limit:
                return await call()

        return await self._env.retry(attempt, ctx)


def _secret_id(name: str, sel: GcpSelection) -> str:
    """The id of a listed secret, whose name must be a secret of the selector's parent (the
    project may come back as its number)."""
    match = _SECRET.fullmatch(name)
    if match is None or match["location"] != sel.location:
        raise _misnamed(name, sel.parent)
    return match["id"]


def _misnamed(name: str, parent: str) -> BridgeError:
    error = StoreUnavailable(
        f"Secret Manager listed {name[:160]!r} under {parent}, which is no name of it; the "
        "listing is refused"
    )
    error.transient = False
    return error


async def _settled(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Every call's answer once all are done, or the first failure among them."""
    got = await asyncio.gather(*calls, return_exceptions=True)
    answers: list[T] = []
    for value in got:
        if isinstance(value, BaseException):
            raise value
        answers.append(value)
    return answers


def _bridge(value: SecretValue | BaseException) -> SecretValue | BridgeError:
    """A read's value or its error; a rejected token is raised, for the one re-login."""
    if isinstance(value, TokenRejected) or not isinstance(value, SecretValue | BridgeError):
        raise value
    return value
