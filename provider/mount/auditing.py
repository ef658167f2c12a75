"""What the audit trail (provider/edge/audit.py) records of a mount's objects: never a value.

For each object of the class: its file name, the store it is read from and its reference there,
both as the store's own `describe()` names them (an address, a path, an ARN, a resource name),
where this mount's value came from (`store`, `cache`, `coalesced`, `revalidated`, `stale`:
provider/mount/fetching.py), and the versions of the files it yielded. A selector's object also
names every secret it delivered (`Served.selected`), each by its reference in the store: the
selector's own reference with the secret's name in place of its `*` (`KV secret/app/*` and `db`:
`KV secret/app/db`), or what the selection ref's `member(name)` says when it has one (a store
whose selector has no `*` to fill in). Names are not secrets; values and their hashes never
appear. Built only when the trail is on; a memoized answer gets a fresh list per mount, because
the sources differ per mount.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from provider.core.model import SecretValue, Source, describe
from provider.mount.planning import KUBELET_PREFIX, selects

if TYPE_CHECKING:
    from provider.mount.planning import MountPlan


@dataclass(frozen=True)
class Served:
    """One object of a mount, as the audit trail records it."""

    name: str
    store: str
    ref: str
    #: None for an object of a refused mount (nothing was served), or when it is not known.
    source: Source | None = None
    #: The versions answered for the object's files (empty for a refused mount).
    versions: tuple[str, ...] = ()
    #: A selector's object: the reference of each secret it delivered, in the order of its
    #: files (empty for a listed object, and for a refused mount).
    selected: tuple[str, ...] = ()


@runtime_checkable
class Members(Protocol):
    """A selection ref that names its secrets itself (its `describe()` has no `*`)."""

    def member(self, name: str) -> str:
        """The store reference of the selected secret named `name` relative to the selector."""
        ...


def served(
    plan: MountPlan,
    object_versions: Sequence[tuple[str, tuple[str, ...]]],
    sources: Mapping[Any, Source] | None,
    values: Mapping[Hashable, Sequence[SecretValue]] | None = None,
) -> tuple[Served, ...]:
    """Every object of `plan`, with its source (by (store index, ref): two stores may hold
    equal refs, two Vault clusters one path) and versions; with the mount's `values` (by the
    same key), every secret each selector delivered."""
    versions = dict(object_versions)
    out = []
    for index, named in enumerate(plan.stores):
        store = describe(named.plan.store)
        for spec in named.plan.objects:
            key = (index, spec.ref)
            source = sources.get(key) if sources is not None else None
            selected: tuple[str, ...] = ()
            if values is not None and selects(spec):
                name = naming(spec.ref)
                selected = tuple(name(v.suffix) for v in values.get(key, ()))
            ref = describe(spec.ref)
            out.append(Served(spec.name, store, ref, source, versions.get(spec.name, ()), selected))
    return tuple(out)


def naming(ref: object) -> Callable[[str], str]:
    """How a selection names its secrets by their store reference: the selector's reference
    with the secret's name for its `*` and what follows it (`KV secret/app/** (5 levels
    down)` and `a/db`: `KV secret/app/a/db`), or the ref's own `member`."""
    if isinstance(ref, Members):
        return ref.member
    text = describe(ref)
    star = text.find("*")
    head = text[:star] if star >= 0 else f"{text}: "
    return lambda name: head + name


def class_digest(params: Mapping[str, str]) -> str:
    """SHA-256 of a class's parameters (the kubelet's own keys left out: the pod, its tokens):
    equal for every pod that mounts the same parameters, and `sha256sum` of the parameters
    written as `key=value\\0`, sorted by key. Never over a value the provider fetched."""
    digest = hashlib.sha256()
    for key in sorted(k for k in params if not k.startswith(KUBELET_PREFIX)):
        digest.update(key.encode("utf-8", "surrogatepass") + b"=")
        digest.update(params[key].encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()
