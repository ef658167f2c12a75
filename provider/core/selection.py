"""Selectors: every secret under a path, with a name prefix, a label or a tag (a class's
`select`), store-neutral.

A store's dialect turns one `select` entry into a selection ref (`Selecting.selection`), a frozen
ref like any other, so a selection is cached, coalesced, rate limited and served stale per
identity as an object is. The store answers it with one `SecretValue` per secret found, its
`suffix` the secret's name relative to the selector (the file is `<directory>/<suffix>`).

Every poll reads: a poll lists the selection with the store's metadata and reads every secret
listed (`Selections.refresh`; with the store's batch read where it has one), so new secrets appear
and deleted ones disappear at the next poll. A listing proves permission to list, never to read:
no value is held here to be reused on the strength of an unchanged marker. Within a class's
`refreshInterval` (or `--cache-ttl`) the whole selection is reused from the value cache, as any
object's value is; past that window a held value would be older than the window anyway.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from provider.core.errors import BridgeError, LimitExceeded, NotFound
from provider.core.model import SecretValue
from provider.core.parsing import Problems

#: Our keys of every `select` entry, beside the store's own filter keys.
COMMON_KEYS = frozenset({"directory", "optional", "store"})


StoreC = TypeVar("StoreC", contravariant=True)
RefC = TypeVar("RefC", covariant=True)


class Selecting(Protocol[StoreC, RefC]):
    """What a dialect that offers selectors also is (docs/selectors.md)."""

    #: The store's own filter keys of a `select` entry (`path`, `namePrefix`, `tags`, ...).
    SELECT_KEYS: frozenset[str]

    def selection(
        self, entry: Mapping[str, Any], store: StoreC, limit: int, where: str, problems: Problems
    ) -> RefC | None:
        """The selection ref of one `select` entry (its store filter keys), problems added to
        `problems`; `limit` is the most secrets it may match (--max-objects)."""
        ...


@dataclass(frozen=True)
class Listed:
    """One secret of a selection as the store's listing names it."""

    #: Its name relative to the selector: the file's path under the selector's directory.
    name: str
    #: The store's change marker (a metadata version, a last-changed time, a version name):
    #: the file's version when the read names none.
    marker: str
    #: What the store reads it by (a path, an ARN, a resource name).
    handle: Hashable


#: Reads the given secrets: each handle's value, or its error.
ReadMany = Callable[[Sequence[Listed]], Awaitable[Mapping[Hashable, SecretValue | BridgeError]]]


def too_many(where: str, found: int, limit: int, *, exact: bool = True) -> LimitExceeded:
    """The error of a selection that matches more than `limit` secrets: `found` of them, or,
    when the listing stopped early (`exact=False`), at least that many."""
    count = f"{found} secrets" if exact else f"more than {limit} secrets"
    return LimitExceeded(
        f"{where} matches {count}, over this provider's limit of {limit} files per class "
        "(--max-objects); narrow the selector (a longer prefix, another tag) or split the class"
    )


class Selections:
    """Reads a listed selection's secrets at every poll; holds no value between polls."""

    def __init__(self) -> None:
        #: Secrets read, over all polls (tests and BENCHMARKS).
        self.read = 0

    async def refresh(
        self, identity_key: str, ref: Hashable, listed: Sequence[Listed], read: ReadMany
    ) -> list[SecretValue] | BridgeError:
        """The selection's values in listing order, every listed secret read now as the pod's
        identity (`identity_key` and `ref` name the selection; nothing is kept under them). A
        secret deleted between the listing and its read is left out (the next listing drops it
        too); any other failure fails the selection."""
        fetched = await read(listed) if listed else {}
        self.read += len(listed)
        values: list[SecretValue] = []
        for secret in listed:
            got = fetched.get(secret.handle)
            if isinstance(got, NotFound) or got is None:
                continue
            if isinstance(got, BridgeError):
                return got
            values.append(
                SecretValue(
                    got.content,
                    version=got.version or secret.marker,
                    data=got.data,
                    suffix=secret.name,
                    source=got.source,
                )
            )
        return values
