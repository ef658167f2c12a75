"""Reading a vault selection (backends/vault/selectors.py): its KV mount, its listing, its
secrets, each secret a `SecretValue` named by its key relative to the selector.

The mount: `GET sys/internal/ui/mounts/<path>` says which KV mount holds the path and its
version, as the `bao kv` and `vault kv` commands ask; any capability on the path lets a token
ask. The answer is kept per identity and path for MOUNT_TTL.

The listing, one LIST (`GET ...?list=true`) per folder (the folders of one level at once), paged
with OpenBao's `limit`/`after` (servers without them answer everything in one page):
- KV v2 on OpenBao: `LIST <mount>/detailed-metadata/<folder>/` names each secret with its
  metadata, so each secret's version (`current_version` and the metadata's `updated_time`)
  comes with the listing, and deleted or destroyed versions are left out without a read; every
  listed secret is read as the pod at every poll past the class's reuse window (a listing
  proves leave to list, not to read: provider/core/selection.py).
- KV v2 where that listing is refused (HashiCorp Vault has none; a policy that grants `list`
  on `<mount>/metadata/` only): `LIST <mount>/metadata/<folder>/`, then every secret is read at
  every poll. Reading each secret's metadata for its version would cost as many calls as
  reading the secret itself, so it is read directly (a log line says which grant leaves
  deleted versions out without a read).
- KV v1 has no versions: `LIST <folder>/`, then every secret is read at every poll.

Bounds: at most `limit` secrets (refused past it, while listing, never holding more than one
page beyond), at most `limit` folders, `depth` levels, and PAGES_BEYOND listing calls beyond
one per folder, each page having to move past the last; a key that would read elsewhere than it
names ('.', '..', an empty name, a '/' inside) fails the selection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from backends.vault.client import Reply, status_error
from backends.vault.objects import VaultRef
from backends.vault.selectors import VaultSelection
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    LimitExceeded,
    NotFound,
    StoreUnavailable,
)
from provider.core.memo import Memo
from provider.core.model import Fetched, SecretValue
from provider.core.selection import Listed, Selections, too_many

log = logging.getLogger("secrets_bridge.vault")
T = TypeVar("T")

#: How long the mount under a selector's path is taken as known (an upgrade of a KV v1 mount
#: to v2, or a new grant on detailed-metadata, shows within this time).
MOUNT_TTL = 300.0
HELD_MOUNTS = 10_000
#: Keys asked per listing call: the most a selection under the limit needs, within 1,000.
MAX_PAGE = 1000
#: Listing calls allowed beyond one per folder (a folder over one page, deleted secrets).
PAGES_BEYOND = 20
_NO_LISTING = ("unsupported path", "no handler for route")

#: One call to Vault as the pod (retried, counted, re-logged in once on a 403):
#: (request, what is being done, the metrics operation) -> the reply, or the call's error.
Call = Callable[[VaultRef, str, str], Awaitable[Reply | BridgeError]]
#: A read's reply as the secret's value (the whole answer, the data map for extraction), and
#: the answer parsed (without its data map); a large one off the event loop.
ValueOf = Callable[[Reply, str], Awaitable[tuple[SecretValue, dict[str, Any]] | BridgeError]]
#: A listing's reply parsed (`Reply.json`); a large one off the event loop.
Parse = Callable[[Reply, str], Awaitable[dict[str, Any]]]


async def _inline(reply: Reply, _doing: str) -> dict[str, Any]:
    return reply.json()


@dataclass(frozen=True)
class KVMount:
    """The KV mount holding a selector's path, as this identity may list it."""

    path: str
    version: int
    #: OpenBao's detailed-metadata listing is granted (KV v2 only).
    detailed: bool

    def listing(self, folder: str) -> str:
        if self.version == 1:
            base = self.path
        else:
            base = f"{self.path}/{'detailed-metadata' if self.detailed else 'metadata'}"
        return f"{base}/{folder}/" if folder else f"{base}/"

    def reading(self, key: str) -> str:
        return f"{self.path}/data/{key}" if self.version == 2 else f"{self.path}/{key}"


@dataclass(frozen=True)
class _Secret:
    name: str  # relative to the selector: the file's path
    key: str  # relative to the mount
    marker: str  # "" where the listing has none


class _Refused:
    """The detailed listing is not granted here: list again with the plain one."""


_REFUSED = _Refused()


async def _all(coros: Sequence[Awaitable[T]]) -> list[T]:
    """Every result, each call run to its end before a raised error (a refused re-login) goes
    up: nothing is left running behind the answer."""

    async def boxed(coro: Awaitable[T]) -> tuple[T]:
        # In a tuple: a returned error must not look like a raised one.
        return (await coro,)

    got = await asyncio.gather(*(boxed(c) for c in coros), return_exceptions=True)
    for outcome in got:
        if isinstance(outcome, BaseException):
            raise outcome
    return [outcome[0] for outcome in got]  # type: ignore[index]


class KVSelector:
    """A backend's selections: mounts known per identity, and the selections' reads."""

    def __init__(self) -> None:
        self._mounts: Memo[tuple[str, str], tuple[KVMount, float]] = Memo(HELD_MOUNTS, HELD_MOUNTS)
        self.selections = Selections()

    async def read(
        self,
        sel: VaultSelection,
        identity_key: str,
        call: Call,
        value_of: ValueOf,
        who: str,
        parse: Parse = _inline,
    ) -> Fetched:
        where = f"the vault selector {sel.path!r}" + (" (recursive)" if sel.recursive else "")
        mount = await self._mount(sel, identity_key, call, who)
        if isinstance(mount, BridgeError):
            return mount
        found = await _Listing(sel, mount, call, who, where, parse).run()
        if isinstance(found, _Refused):
            log.info(
                "listing %s with its metadata is not granted to %s: each of its secrets is read "
                "at every poll; grant list on %s to leave deleted versions out without a read",
                sel.path,
                who,
                mount.listing(sel.path[len(mount.path) + 1 :]) + "*",
            )
            mount = KVMount(mount.path, mount.version, detailed=False)
            self._mounts.put((identity_key, sel.path), (mount, time.monotonic() + MOUNT_TTL), 1)
            found = await _Listing(sel, mount, call, who, where, parse).run()
        if isinstance(found, BridgeError | _Refused):
            return found if isinstance(found, BridgeError) else _garbled(where)
        reader = _Reader(mount, call, value_of, who, where)
        if mount.detailed:
            listed = [Listed(s.name, s.marker, s.key) for s in found]
            return await self.selections.refresh(identity_key, sel, listed, reader.read)
        return await reader.every(found)

    async def _mount(
        self, sel: VaultSelection, identity_key: str, call: Call, who: str
    ) -> KVMount | BridgeError:
        key = (identity_key, sel.path)
        held = self._mounts.get(key)
        if held is not None and held[1] > time.monotonic():
            return held[0]
        doing = f"finding the KV mount of {sel.path!r} {who}"
        reply = await call(VaultRef(f"sys/internal/ui/mounts/{sel.path}"), doing, "mounts")
        if isinstance(reply, BridgeError):
            return reply
        if reply.status != 200:
            return status_error(
                reply,
                doing,
                denied=f"grant the role list on the KV path {sel.path} (<mount>/metadata/... "
                "for KV version 2); Vault answers which mount holds a path only to a token "
                "with a capability on it",
                not_found="no secrets engine is mounted there",
            )
        mount = _mount_of(reply.json().get("data"), sel.path, doing)
        if isinstance(mount, KVMount):
            self._mounts.put(key, (mount, time.monotonic() + MOUNT_TTL), 1)
        return mount


def _mount_of(data: Any, path: str, doing: str) -> KVMount | BridgeError:
    if not isinstance(data, dict) or not isinstance(data.get("path"), str):
        return _garbled(doing)
    mount = data["path"].strip("/")
    if not mount or not (path == mount or path.startswith(mount + "/")):
        return _garbled(doing)
    kind = data.get("type")
    if kind not in ("kv", "generic"):
        return InvalidParameters(
            f"{doing}: {mount}/ is a {str(kind)[:40]!r} secrets engine, not KV; a selector "
            "lists KV secrets only (list other engines' paths as objects)"
        )
    options = data.get("options")
    version = options.get("version") if isinstance(options, dict) else None
    v2 = str(version) == "2"
    return KVMount(mount, 2 if v2 else 1, detailed=v2)


def _garbled(doing: str) -> StoreUnavailable:
    error = StoreUnavailable(f"{doing}: the answer is not Vault's; does vaultAddress point at it?")
    error.transient = False
    return error


class _Listing:
    """One read's listing of a selection, breadth first."""

    def __init__(
        self, sel: VaultSelection, mount: KVMount, call: Call, who: str, where: str, parse: Parse
    ) -> None:
        self.sel, self.mount, self.call, self.who, self.where = sel, mount, call, who, where
        self.parse = parse
        self.page = min(2 * sel.limit + 2, MAX_PAGE)
        self.spare_pages = PAGES_BEYOND + (2 * sel.limit + 2) // MAX_PAGE
        self.secrets: list[_Secret] = []
        self.folders = 0
        # The selector's folder under the mount ("" for the mount's root).
        self.root = sel.path[len(mount.path) + 1 :]
        self.now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")

    async def run(self) -> list[_Secret] | BridgeError | _Refused:
        level = [""]
        for depth in range(self.sel.depth + 1):
            listed = await _all([self._folder(f) for f in level])
            below: list[str] = []
            for folder, got in zip(level, listed, strict=True):
                if isinstance(got, NotFound):
                    continue  # the selector's folder has no secrets, or a folder just emptied
                if isinstance(got, BridgeError | _Refused):
                    return got
                for sub in got:
                    path = f"{folder}{sub}/"
                    if depth == self.sel.depth:
                        return LimitExceeded(
                            f"{self.where}: the folder {self._shown(path)!r} is deeper than the "
                            f"selector's depth of {self.sel.depth}; raise depth (at most 10) "
                            "or select that folder with a selector of its own"
                        )
                    below.append(path)
            level = below
            if not level:
                break
        return sorted(self.secrets, key=lambda s: s.name)

    def _shown(self, folder: str) -> str:
        return f"{self.sel.path}/{folder}".rstrip("/")

    async def _folder(self, folder: str) -> list[str] | BridgeError | _Refused:
        """The subfolders of one folder; its secrets go to `self.secrets`."""
        subfolders: list[str] = []
        after = ""
        first = True
        while True:
            if not first:
                self.spare_pages -= 1
                if self.spare_pages < 0:
                    return self._endless()
            first = False
            page = await self._page(folder, after)
            if isinstance(page, BridgeError | _Refused):
                return page
            keys, info = page
            fresh = [k for k in keys if k > after]
            if keys and not fresh:
                return self._endless()
            for key in fresh:
                problem = self._take(folder, key, info.get(key), subfolders)
                if problem is not None:
                    return problem
            if len(keys) != self.page:  # a short page ends it; so does an unpaged answer
                return subfolders
            after = keys[-1]

    async def _page(
        self, folder: str, after: str
    ) -> tuple[list[str], dict[str, Any]] | BridgeError | _Refused:
        """One page of a folder's keys, and their metadata (detailed listing only)."""
        under = f"{self.root}/{folder}".strip("/")
        path = self.mount.listing(under)
        # GET with list=true rather than the LIST verb, as Vault's Go client sends it: proxies
        # and HTTP servers that know only the standard methods pass it.
        query: tuple[tuple[str, str], ...] = (("limit", str(self.page)), ("list", "true"))
        query += (("after", after),) if after else ()
        doing = f"listing {path} for {self.where} {self.who}"
        reply = await self.call(VaultRef(path, "GET", tuple(sorted(query))), doing, "list")
        if isinstance(reply, BridgeError):
            return reply
        if self.mount.detailed and _not_granted(reply):
            return _REFUSED
        if reply.status != 200:
            return status_error(
                reply, doing, denied=f"grant the role list on {self.mount.listing(under)}*"
            )
        data = (await self.parse(reply, doing)).get("data")
        keys = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            return _garbled(doing)
        info = data.get("key_info") if isinstance(data, dict) else None
        return keys, info if isinstance(info, dict) else {}

    def _take(self, folder: str, key: str, info: Any, subfolders: list[str]) -> BridgeError | None:
        """One listed key: a subfolder to descend into, a secret, or a refusal."""
        is_folder = key.endswith("/")
        name = key[:-1] if is_folder else key
        if name in ("", ".", "..") or "/" in name or "\x00" in name:
            return InvalidParameters(
                f"{self.where}: Vault lists a key {key[:80]!r} under {self._shown(folder)!r}, "
                "which would read or write elsewhere than it names; rename it in Vault"
            )
        if is_folder and not self.sel.recursive:
            return None
        if is_folder:
            self.folders += 1
            if self.folders > self.sel.limit:
                return LimitExceeded(
                    f"{self.where} holds more than {self.sel.limit} folders, over this "
                    "provider's limit of files per class (--max-objects); narrow the selector"
                )
            subfolders.append(name)
            return None
        marker = ""
        if self.mount.detailed:
            marker = _marker(info, self.now)
            if not marker:
                return None  # deleted, destroyed, or metadata without a version: no secret
        under = f"{self.root}/{folder}{name}".strip("/")
        self.secrets.append(_Secret(f"{folder}{name}", under, marker))
        if len(self.secrets) > self.sel.limit:
            return too_many(self.where, len(self.secrets), self.sel.limit, exact=False)
        return None

    def _endless(self) -> StoreUnavailable:
        error = StoreUnavailable(
            f"{self.where}: Vault's listing did not end (pages that do not move on, or more "
            f"than {PAGES_BEYOND} pages beyond one per folder); is vaultAddress a Vault?"
        )
        error.transient = False
        return error


def _not_granted(reply: Reply) -> bool:
    """The detailed listing refused (no grant) or unknown (HashiCorp Vault)."""
    if reply.status in (403, 405):
        return True
    return reply.status == 404 and any(p in reply.errors() for p in _NO_LISTING)


def _marker(info: Any, now: str) -> str:
    """A secret's change marker from its detailed metadata: its current version and when its
    metadata last changed (custom metadata is part of the answer); "" when it has nothing to
    read (no version, or the current one deleted or destroyed)."""
    if not isinstance(info, dict):
        return ""
    current = info.get("current_version")
    if not isinstance(current, int) or isinstance(current, bool) or current <= 0:
        return ""
    versions = info.get("versions")
    state = versions.get(str(current)) if isinstance(versions, dict) else None
    if isinstance(state, dict):
        deleted = state.get("deletion_time")
        if state.get("destroyed") is True:
            return ""
        if isinstance(deleted, str) and deleted and deleted[:19] <= now:
            return ""
    return f"{current}@{str(info.get('updated_time', ''))[:40]}"


class _Reader:
    """Reading a selection's secrets, all at once."""

    def __init__(self, mount: KVMount, call: Call, value_of: ValueOf, who: str, where: str) -> None:
        self.mount, self.call, self.value_of = mount, call, value_of
        self.who, self.where = who, where

    async def one(self, key: str, marker: str) -> SecretValue | BridgeError:
        path = self.mount.reading(key)
        doing = f"reading {path} for {self.where} {self.who}"
        reply = await self.call(VaultRef(path), doing, "read")
        if isinstance(reply, BridgeError):
            return reply
        if not 200 <= reply.status < 300:
            return status_error(reply, doing, denied=f"grant the role read on {path}")
        got = await self.value_of(reply, doing)
        if isinstance(got, BridgeError):
            return got
        value, payload = got
        if marker:
            # Written between the listing and this read: the version this answer holds, so
            # that the file's version changes with its content (the next poll's marker moves).
            meta = _metadata(payload)
            read = meta.get("version")
            if read is not None and str(read) != marker.partition("@")[0]:
                created = str(meta.get("created_time", ""))[:40]
                return dataclasses.replace(value, version=f"{read}@{created}")
        return value

    async def read(self, secrets: Sequence[Listed]) -> dict[Hashable, SecretValue | BridgeError]:
        got = await _all([self.one(str(s.handle), s.marker) for s in secrets])
        return {s.handle: value for s, value in zip(secrets, got, strict=True)}

    async def every(self, secrets: Sequence[_Secret]) -> Fetched:
        """Every secret read now (no marker to compare): in listing order, a secret deleted
        since the listing left out, any other failure failing the selection."""
        got = await _all([self.one(s.key, "") for s in secrets])
        values: list[SecretValue] = []
        for secret, value in zip(secrets, got, strict=True):
            if isinstance(value, NotFound):
                continue
            if isinstance(value, BridgeError):
                return value
            values.append(dataclasses.replace(value, suffix=secret.name))
        return values


def _metadata(payload: dict[str, Any]) -> dict[str, Any]:
    """A KV v2 answer's `data.metadata` ({} for KV v1)."""
    data = payload.get("data")
    meta = data.get("metadata") if isinstance(data, dict) else None
    return meta if isinstance(meta, dict) else {}
