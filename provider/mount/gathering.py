"""The values of a class of several stores (docs/multi-store.md): every store identifies the pod
first, then every store is read at once within the mount's one deadline, then the objects a
store did not find are read from their fallback stores.

Each store is fetched through the same `Fetcher` as a single-store class, with its own backend
and identity, so caches, single-flight, fetch slots and rate limits stay per store and identity
(an identity key includes the store's address). Only "not found" sends an object to its
fallback: an error or an outage of the primary store must not silently switch sources.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from backends import registry
from provider.core.backend import AnyBackend
from provider.core.errors import BridgeError, MissingCredential, MountFailed, NotFound
from provider.core.metrics import Metrics
from provider.core.model import (
    AnyPlan,
    FetchContext,
    Fetched,
    Identity,
    ObjectSpec,
    Pod,
    Source,
)
from provider.core.model import SecretValue as Value
from provider.mount.fetching import Fetcher
from provider.mount.lifetimes import Owner
from provider.mount.planning import MountPlan
from provider.mount.stores import Fallback, NamedStore

log = logging.getLogger("secrets_bridge.mounting")

E = TypeVar("E", bound=BridgeError)
#: (the spec a file is built with, its key into the values).
Inputs = list[tuple[ObjectSpec[Any], Hashable]]


@dataclass
class Gathered:
    inputs: Inputs
    values: dict[Hashable, Sequence[Value]]
    failures: list[tuple[str, BridgeError]]


async def gather(
    plan: MountPlan,
    pod: Pod,
    ctx: FetchContext,
    *,
    backend_for: Callable[[str], AnyBackend],
    fetcher: Fetcher,
    metrics: Metrics | None,
    sources: dict[tuple[int, Hashable], Source] | None = None,
) -> Gathered:
    """`sources` (for the audit trail), when given, receives where each store's values came
    from, keyed by (store index, ref)."""
    stores = plan.stores
    backends = [backend_for(s.plan.backend) for s in stores]
    identities = await _identify(stores, backends, pod)
    owner = plan.owner(pod)
    per_store: list[dict[Hashable, Source] | None] = [
        {} if sources is not None else None for _ in stores
    ]
    async with asyncio.TaskGroup() as group:
        reads = [
            group.create_task(
                _read(fetcher, b, s.plan, i, [o.ref for o in s.plan.objects], ctx, seen, owner)
            )
            for s, b, i, seen in zip(stores, backends, identities, per_store, strict=True)
        ]
    primary = [task.result() for task in reads]
    if sources is not None:
        for index, seen in enumerate(per_store):
            sources.update({(index, ref): source for ref, source in (seen or {}).items()})
    wanted: dict[int, list[Fallback]] = {}
    for s, results in zip(stores, primary, strict=True):
        for spec, fallback in zip(s.plan.objects, s.fallbacks, strict=True):
            if fallback is not None and isinstance(results[spec.ref], NotFound):
                wanted.setdefault(fallback.store, []).append(fallback)
    second = await _read_fallbacks(fetcher, stores, backends, identities, wanted, ctx, owner)
    gathered = Gathered([], {}, [])
    for index, (s, results) in enumerate(zip(stores, primary, strict=True)):
        for spec, fallback in zip(s.plan.objects, s.fallbacks, strict=True):
            result = results[spec.ref]
            if isinstance(result, NotFound) and fallback is not None:
                _use_fallback(gathered, s, spec, result, stores, fallback, second, metrics)
            elif isinstance(result, BridgeError):
                gathered.failures.append((spec.name, _in_store(s, spec.name, result)))
            else:
                gathered.values[(index, spec.ref)] = result
                gathered.inputs.append((spec, (index, spec.ref)))
    return gathered


async def _identify(
    stores: Sequence[NamedStore], backends: Sequence[AnyBackend], pod: Pod
) -> list[Identity]:
    """Every store's identity, before any cache is consulted; one error naming every store that
    refused, and, for a missing token, every audience the class needs."""
    outcomes = await asyncio.gather(
        *(b.identify(s.plan, pod) for s, b in zip(stores, backends, strict=True)),
        return_exceptions=True,
    )
    refused: list[tuple[NamedStore, BridgeError]] = []
    for s, outcome in zip(stores, outcomes, strict=True):
        if isinstance(outcome, BridgeError):
            refused.append((s, outcome))
        elif isinstance(outcome, BaseException):
            raise outcome
    if not refused:
        return [o for o in outcomes if isinstance(o, Identity)]
    text = "; ".join(f"{s.label}: {err}" for s, err in refused)
    if any(isinstance(err, MissingCredential) for _, err in refused):
        text += f" (this class needs pod tokens for the audiences: {_audiences(stores)})"
    # The code of the most actionable refusal, as MountFailed chooses it.
    code = MountFailed([(s.name, err) for s, err in refused]).code
    first = next(err for _, err in refused if err.code == code)
    raise _restated(first, text)


def _audiences(stores: Sequence[NamedStore]) -> str:
    listed = [
        f"{audience!r} ({s.label})"
        for s in stores
        for audience in registry.dialect_module(s.plan.backend).audiences(s.plan.store)
    ]
    return ", ".join(listed) or "none"


async def _read(
    fetcher: Fetcher,
    backend: AnyBackend,
    plan: AnyPlan,
    identity: Identity,
    refs: Sequence[Hashable],
    ctx: FetchContext,
    sources: dict[Hashable, Source] | None = None,
    owner: Owner | None = None,
) -> dict[Hashable, Fetched]:
    """One store's values; a store that refuses as a whole (a login) fails each of its refs."""
    if not refs:
        return {}
    try:
        return await fetcher.fetch(backend, plan, identity, refs, ctx, sources, owner)
    except BridgeError as exc:
        return {ref: exc for ref in refs}


async def _read_fallbacks(
    fetcher: Fetcher,
    stores: Sequence[NamedStore],
    backends: Sequence[AnyBackend],
    identities: Sequence[Identity],
    wanted: dict[int, list[Fallback]],
    ctx: FetchContext,
    owner: Owner | None = None,
) -> dict[int, dict[Hashable, Fetched]]:
    if not wanted:
        return {}
    async with asyncio.TaskGroup() as group:
        tasks = {}
        for index, fallbacks in wanted.items():
            plan = stores[index].fallback_plan
            assert plan is not None  # a store some object falls back to has one
            refs = [f.spec.ref for f in fallbacks]
            read = _read(fetcher, backends[index], plan, identities[index], refs, ctx, None, owner)
            tasks[index] = group.create_task(read)
    return {index: task.result() for index, task in tasks.items()}


def _use_fallback(
    gathered: Gathered,
    store: NamedStore,
    spec: ObjectSpec[Any],
    not_found: NotFound,
    stores: Sequence[NamedStore],
    fallback: Fallback,
    second: dict[int, dict[Hashable, Fetched]],
    metrics: Metrics | None,
) -> None:
    other = stores[fallback.store]
    result = second[fallback.store][fallback.spec.ref]
    outcome = type(result).__name__ if isinstance(result, BridgeError) else "ok"
    if metrics is not None:
        metrics.fallback_reads.labels(store.plan.backend, outcome).inc()
    if isinstance(result, BridgeError):
        text = f"{not_found}; its fallback in {other.label}: {result}"
        gathered.failures.append((spec.name, _in_store(store, spec.name, _restated(result, text))))
        return
    log.info(
        "object read from its fallback store",
        extra={
            "fields": {
                "object": spec.name,
                "store": store.name,
                "fallback_store": other.name,
                "backend": store.plan.backend,
                "fallback_backend": other.plan.backend,
            }
        },
    )
    key = (fallback.store, fallback.spec.ref, "fallback")
    gathered.values[key] = result
    gathered.inputs.append((fallback.spec, key))


def _in_store(store: NamedStore, name: str, error: BridgeError) -> BridgeError:
    """`object 'x': in store 'aws': <cause>` (MountFailed keeps a cause that names its object)."""
    prefix = f"object {name!r}: "
    text = str(error)
    text = text[len(prefix) :] if text.startswith(prefix) else text
    return _restated(error, f"{prefix}in {store.label}: {text}")


def _restated(error: E, text: str) -> E:
    """A copy of `error` (same type, code, retry hints) with another message."""
    copy = error.__class__.__new__(error.__class__)
    copy.__dict__.update(error.__dict__)
    copy.message = text
    copy.args = (text,)
    return copy
