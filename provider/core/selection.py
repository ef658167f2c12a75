"""Selectors: every secret under a path, with a name prefix, a label or a tag (a class's
`select`), store-neutral.

A store's dialect turns one `select` entry into a selection ref (`Selecting.selection`), a frozen
ref like any other, so a selection is cached, coalesced, rate limited and served stale per
identity as an object is. The store answers it with one `SecretValue` per secret found, its
`suffix` the secret's name relative to the selector (the file is `<directory>/<suffix>`).

Cheap rotation: a poll lists the selection with the store's metadata (a version, a last-changed
time) and reads again only the secrets whose marker changed since that identity's last read
(`Selections.refresh`); new secrets appear and deleted ones disappear at the next poll.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from provider.core.caching import ExpiringCache
from provider.core.errors import BridgeError, LimitExceeded, NotFound
from provider.core.limits import namespace_of
from provider.core.model import SecretValue
from provider.core.parsing import Problems

#: Our keys of every `select` entry, beside the store's own filter keys.
COMMON_KEYS = frozenset({"directory", "optional", "store"})
#: Selections whose secrets' markers and values are held for cheap polls, and their bytes.
HELD_SELECTIONS = 2_000
HELD_BYTES = 32 * 1024 * 1024
#: Seconds a selection's held secrets outlive its last read (an idle identity's go; its next
#: poll reads every secret again).
HELD_FOR = 3600.0


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
    #: a poll reads the secret again only when it differs from the one held.
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
    """Per (identity key, selection ref): the markers and values of its secrets at the last
    read, bounded in entries and bytes and shared fairly by namespace as the value cache is
    (a tenant's selections are values held like any cached value, under its identity: never
    answered to another, and one namespace's churn cannot evict the others')."""

    def __init__(self, max_entries: int = HELD_SELECTIONS, max_bytes: int = HELD_BYTES) -> None:
        self._held: ExpiringCache[dict[str, tuple[str, SecretValue]]] = ExpiringCache(
            max_entries=max_entries,
            max_bytes=max_bytes,
            size_of=_held_size,
            tenant_of=namespace_of,
        )
        #: Secrets read again, and reused unchanged, over all polls (tests and BENCHMARKS).
        self.read = 0
        self.reused = 0

    async def refresh(
        self, identity_key: str, ref: Hashable, listed: Sequence[Listed], read: ReadMany
    ) -> list[SecretValue] | BridgeError:
        """The selection's values in listing order: the secrets whose marker is unchanged from
        the held ones, the others read now. A secret deleted between the listing and its read
        is left out (the next listing drops it too); any other failure fails the selection."""
        key = (identity_key, ref)
        held = self._held.get(key) or {}
        changed = [s for s in listed if s.name not in held or held[s.name][0] != s.marker]
        fetched = await read(changed) if changed else {}
        self.read += len(changed)
        self.reused += len(listed) - len(changed)
        now: dict[str, tuple[str, SecretValue]] = {}
        values: list[SecretValue] = []
        for secret in listed:
            if secret.name in held and held[secret.name][0] == secret.marker:
                value = held[secret.name][1]
            else:
                got = fetched.get(secret.handle)
                if isinstance(got, NotFound) or got is None:
                    continue
                if isinstance(got, BridgeError):
                    return got
                value = SecretValue(
                    got.content,
                    version=got.version or secret.marker,
                    data=got.data,
                    suffix=secret.name,
                    source=got.source,
                )
            now[secret.name] = (secret.marker, value)
            values.append(value)
        self._held.put(key, now, HELD_FOR)
        return values


def _held_size(held: dict[str, tuple[str, SecretValue]]) -> int:
    return sum(len(value.content) + len(name) for name, (_marker, value) in held.items())
