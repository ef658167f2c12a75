"""What the audit trail (provider/edge/audit.py) records of a mount's objects: never a value.

For each object of the class: its file name, the store it is read from and its reference there,
both as the store's own `describe()` names them (an address, a path, an ARN, a resource name),
where this mount's value came from (`store`, `cache`, `coalesced`, `revalidated`, `stale`:
provider/mount/fetching.py), and the versions of the files it yielded. Built only when the trail
is on; a memoized answer gets a fresh list per mount, because the sources differ per mount.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from provider.core.model import Source, describe
from provider.mount.planning import KUBELET_PREFIX

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


def served(
    plan: MountPlan,
    object_versions: Sequence[tuple[str, tuple[str, ...]]],
    sources: Mapping[Any, Source] | None,
) -> tuple[Served, ...]:
    """Every object of `plan`, with its source (by (store index, ref): two stores may hold
    equal refs, two Vault clusters one path) and versions."""
    versions = dict(object_versions)
    out = []
    for index, named in enumerate(plan.stores):
        store = describe(named.plan.store)
        for spec in named.plan.objects:
            source = sources.get((index, spec.ref)) if sources is not None else None
            out.append(
                Served(spec.name, store, describe(spec.ref), source, versions.get(spec.name, ()))
            )
    return tuple(out)


def class_digest(params: Mapping[str, str]) -> str:
    """SHA-256 of a class's parameters (the kubelet's own keys left out: the pod, its tokens):
    equal for every pod that mounts the same parameters, and `sha256sum` of the parameters
    written as `key=value\\0`, sorted by key. Never over a value the provider fetched."""
    digest = hashlib.sha256()
    for key in sorted(k for k in params if not k.startswith(KUBELET_PREFIX)):
        digest.update(key.encode("utf-8", "surrogatepass") + b"=")
        digest.update(params[key].encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()
