"""One store's read for one mount: which backend, with which plan of the class, as whom.

The fetch path (provider/mount/fetching.py -> lifetimes.py -> loads.py) carries a `StoreRead`
whole: a value is cached, coalesced and held under its identity, its store's slots and rate
limits apply by the plan's backend name, and the backend reads it with the plan and identity.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

from provider.core.backend import AnyBackend
from provider.core.model import AnyPlan, Identity


class StoreRead(NamedTuple):
    """(A NamedTuple: one is made per store per mount, on the cached path too.)"""

    backend: AnyBackend
    #: The store's plan (a class of several stores: one store's, or its fallback plan).
    plan: AnyPlan
    #: Who the pod is for this store (identify's answer, before any cache is consulted).
    identity: Identity
    #: Seconds its values may be reused from the value cache: the class's `refreshInterval`;
    #: None for the provider's --cache-ttl.
    refresh: float | None = None

    @property
    def store(self) -> str:
        """The backend's name: metrics, fetch slots, rate limits and messages go by it."""
        return self.plan.backend

    def key(self, ref: Hashable) -> tuple[str, Hashable]:
        """What a value is cached, held stale and coalesced under: (identity key, ref)."""
        return (self.identity.key, ref)
