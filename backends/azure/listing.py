"""A selection's secrets: the vault's listing, page by page, matched as the pages arrive.

Key Vault cannot filter a listing, so a selector walks the vault's secrets (25 a page, names,
tags and attributes, no values) and keeps the enabled ones its prefix and tags match. The walk
is bounded twice: it stops as soon as more than the selector's limit matched (`too_many`,
never a vault's worth of entries in memory), and after MAX_PAGES pages (a vault too large to
scan at each poll, or a server whose `nextLink` never ends). A `nextLink` is followed only on the
vault's own host, never twice.

Secrets backing certificates (`managed`) are left out: a certificate's private key is read as
its certificate (`objectType: cert`, or its secret listed by name), never swept up by a prefix.

Change marker: the secret's version when the listing names it (Key Vault's does not) and the
`updated` time of its current version, which a new version or an attribute change moves. Key
Vault keeps that time in whole seconds, so a secret read in the same second as it changed could
change again unseen: a secret updated less than RECENT seconds before the listing gets a marker
of its own, read again at the next poll.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, urlsplit

from backends.azure.client import PAGE_SIZE, VaultReader
from backends.azure.selectors import AzureSelection
from provider.core.errors import LimitExceeded, StoreUnavailable
from provider.core.selection import Listed, too_many

#: Pages one listing reads at most: 5,000 secrets at Key Vault's 25 a page.
MAX_PAGES = 200
#: Seconds after a change within which a secret's `updated` time is not trusted as its marker.
RECENT = 60.0
# A Key Vault object name: what the listing's ids must carry (the file name comes from it).
_NAME = re.compile(r"^[-A-Za-z0-9]{1,127}$")
_fresh = itertools.count(1)


async def listed(
    reader: VaultReader,
    selection: AzureSelection,
    now: Callable[[], float] = time.time,
) -> list[Listed]:
    """The secrets the selection matches, in the vault's order; their handles are names."""
    where = reader.where(selection)
    found: list[Listed] = []
    link: str | None = None
    followed: set[str] = set()
    for _page in range(MAX_PAGES):
        items, link = await reader.list_page(selection, link)
        for props in items:
            secret = _matched(props, selection, where, now())
            if secret is None:
                continue
            found.append(secret)
            if len(found) > selection.limit:
                raise too_many(where, len(found), selection.limit, exact=False)
        if link is None:
            return found
        _check_link(link, reader.vault_url, followed, where)
    raise LimitExceeded(
        f"{where}: the listing did not end after {MAX_PAGES} pages ({MAX_PAGES * PAGE_SIZE} "
        "secrets); Key Vault cannot filter a listing, so a selector scans at most that many "
        "secrets of a vault: list the objects by name, or keep them in a smaller vault"
    )


def _matched(props: Any, selection: AzureSelection, where: str, now: float) -> Listed | None:
    name = props.name or ""
    if props.enabled is False or props.managed or not selection.matches(name, props.tags):
        return None
    if not _NAME.match(name):
        error = StoreUnavailable(
            f"{where}: the vault listed a secret named {name[:130]!r}, which is not a Key Vault "
            "name (letters, digits and '-'); refused"
        )
        error.transient = False
        raise error
    relative = name[len(selection.prefix) :]
    if not relative:
        return None  # the secret named by the prefix itself: nothing under it
    return Listed(relative, _marker(props, now), name)


def _marker(props: Any, now: float) -> str:
    updated = props.updated_on or props.created_on
    stamp = int(updated.timestamp()) if updated is not None else 0
    marker = f"{props.version or ''}@{stamp}"
    if updated is None or now - stamp < RECENT:
        marker += f"~{next(_fresh)}"  # unique: read again at the next poll
    return marker


def _check_link(link: str, vault_url: str, followed: set[str], where: str) -> None:
    """A `nextLink` on another host would take the pod's vault token there; one seen before
    would list the same pages again."""
    theirs = urlsplit(link)
    if _origin(theirs) != _origin(urlsplit(vault_url)):
        error = StoreUnavailable(
            f"{where}: the listing's next page is on {theirs.netloc[:100] or 'no host'!r}, not the "
            "vault; secrets-bridge follows a nextLink on the vault's own host only"
        )
        error.transient = False
        raise error
    if link in followed:
        error = StoreUnavailable(f"{where}: the listing's nextLink repeats a page already read")
        error.transient = False
        raise error
    followed.add(link)


def _origin(url: SplitResult) -> tuple[str, str, int | None]:
    """Scheme, host and port (Key Vault's nextLinks name :443, its vault URLs do not)."""
    try:
        port = url.port or (443 if url.scheme == "https" else None)
    except ValueError:
        port = -1
    return url.scheme, (url.hostname or "").lower(), port
