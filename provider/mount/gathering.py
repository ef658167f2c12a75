"""A mount's values, for a class of one store or several: every store identifies the pod first,
then every store is read at once within the mount's one deadline, then the objects a store did
not find are read from their fallback stores (docs/multi-store.md).

A `backend:` class is the same walk with one store and no fallbacks; its errors are its store's
own, where a class of several stores names the store in each. Each store is read through the
one `Fetcher` with its own backend and identity (a `StoreRead`), so caches, single-flight, fetch
slots and rate limits stay per store and identity (an identity key includes the store's
address). Values are keyed by (store index, ref): two stores may hold equal refs. Only "not
found" sends an object to its fallback: an error or an outage of the primary store must not
silently switch sources.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from backends import registry
from provider.core.backend import AnyBackend
from provider.core.errors import BridgeError, MissingCredential, MountFailed, NotFound
from provider.core.model import FetchContext, Fetched, Identity, ObjectSpec, Pod, Source
from provider.core.model import SecretValue as Value
from provider.mount.fetching import Fetcher
from provider.mount.lifetimes import Owner
from provider.mount.planning import Inputs, MountPlan, failed_as
from provider.mount.reads import StoreRead
from provider.mount.stores import Fallback, NamedStore

log = logging.getLogger("secrets_bridge.mounting")

E = TypeVar("E", bound=BridgeError)
T = TypeVar("T")
#: One store's outcome: each ref's values or error, or the store's refusal as a whole (a login).
_Read = dict[Hashable, Fetched] | BridgeError


class Gathered(NamedTuple):
    """(A NamedTuple: the cached path makes one per mount.)"""

    #: What the files are built from, in order (provider/mount/building.py).
    inputs: Inputs
    #: Values by (store index, ref); a fallback's by (its store's index, ref, "fallback").
    values: dict[Hashable, Sequence[Value]]
    failures: list[tuple[str, BridgeError]]
    #: The `optional` objects the store (and their fallback) did not have: no files.
    absent: list[ObjectSpec[Any]]


async def identify(
    plan: MountPlan, pod: Pod, backend_for: Callable[[str], AnyBackend]
) -> list[StoreRead]:
    """Each store's read: its backend, plan and the pod's identity there, before any cache is
    consulted. A class of several stores gets one error naming every store that refused and,
    for a missing token, every audience the class needs."""
    stores = plan.stores
    if not plan.named:  # one store: its refusal is its own, raised as it is
        store = stores[0].plan
        backend = backend_for(store.backend)
        return [StoreRead(backend, store, await backend.identify(store, pod), plan.refresh)]
    backends = [backend_for(s.plan.backend) for s in stores]
    outcomes = await _together(
        [_identity(b, s, pod) for s, b in zip(stores, backends, strict=True)]
    )
    refused = [(s, o) for s, o in zip(stores, outcomes, strict=True) if isinstance(o, BridgeError)]
    if refused:
        raise _refusal(plan, refused)
    return [
        StoreRead(b, s.plan, o, plan.refresh)
        for s, b, o in zip(stores, backends, outcomes, strict=True)
        if isinstance(o, Identity)
    ]


def cached(fetcher: Fetcher, plan: MountPlan, reads: Sequence[StoreRead]) -> Gathered | None:
    """Every value of the class from the value cache, or None: a cached mount's whole fetch,
    without setting up a read."""
    if len(reads) == 1:  # the usual class: no store index to look up per key
        identity = reads[0].identity.key
        keys = [(identity, ref) for _, ref in plan.keys]
    else:
        identities = [read.identity.key for read in reads]
        keys = [(identities[i], ref) for i, ref in plan.keys]
    found = fetcher.cached(keys, plan.refresh)
    if found is None or not all(found):  # an empty selection: `gather` says if it may be
        return None
    return Gathered(plan.inputs, dict(zip(plan.keys, found, strict=True)), [], [])


async def gather(
    plan: MountPlan,
    reads: Sequence[StoreRead],
    ctx: FetchContext,
    *,
    fetcher: Fetcher,
    owner: Owner,
    sources: dict[Hashable, Source] | None = None,
) -> Gathered:
    """Every store's values, then the fallbacks'. `sources` (for the audit trail), when given,
    receives where each value came from, keyed by (store index, ref)."""
    stores = plan.stores
    per_store: list[dict[Hashable, Source] | None] = [
        {} if sources is not None else None for _ in stores
    ]
    primary = await _together(
        [
            _read(fetcher, read, _refs(s), ctx, seen, owner)
            for s, read, seen in zip(stores, reads, per_store, strict=True)
        ]
    )
    if sources is not None:
        for index, seen in enumerate(per_store):
            sources.update({(index, ref): source for ref, source in (seen or {}).items()})
    outcomes = [_per_ref(s, r) for s, r in zip(stores, primary, strict=True)]
    wanted: dict[int, list[Fallback]] = {}
    for s, results in zip(stores, outcomes, strict=True):
        for spec, fallback in _with_fallbacks(s):
            if fallback is not None and isinstance(results[spec.ref], NotFound):
                wanted.setdefault(fallback.store, []).append(fallback)
    second = await _read_fallbacks(fetcher, stores, reads, wanted, ctx, owner)
    inputs: list[tuple[ObjectSpec[Any], Hashable]] = []
    gathered = Gathered(inputs, {}, [], [])
    for index, (s, results) in enumerate(zip(stores, outcomes, strict=True)):
        for spec, fallback in _with_fallbacks(s):
            result = results[spec.ref]
            if isinstance(result, NotFound) and fallback is not None:
                _use_fallback(gathered, inputs, s, spec, result, stores, fallback, second, fetcher)
            elif isinstance(result, NotFound) and spec.transforms.optional:
                _absent(gathered, spec, index, sources)
            elif isinstance(result, BridgeError):
                gathered.failures.append((failed_as(spec), _in_store(s, spec.name, result)))
            elif not result and not spec.transforms.optional:
                error = NotFound(f"{spec.field}: no secret matches it (optional: false)")
                gathered.failures.append((failed_as(spec), _in_store(s, spec.name, error)))
            else:
                gathered.values[(index, spec.ref)] = result
                inputs.append((spec, (index, spec.ref)))
    return gathered


def _refs(store: NamedStore) -> list[Hashable]:
    """The store's refs, each once (several objects may share a read: a lease's two fields)."""
    return list(dict.fromkeys(spec.ref for spec in store.plan.objects))


def _with_fallbacks(store: NamedStore) -> Iterator[tuple[ObjectSpec[Any], Fallback | None]]:
    """Each object of the store with its fallback, if it names one (a `backend:` class names
    none)."""
    fallbacks = store.fallbacks or (None,) * len(store.plan.objects)
    return zip(store.plan.objects, fallbacks, strict=True)


async def _together(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Each call's result, the calls run at once; a lone call is awaited in this task (an
    outage holds every waiting mount's frames, and a task each would cost memory)."""
    if len(calls) == 1:
        return [await calls[0]]
    return list(await asyncio.gather(*calls))


async def _identity(backend: AnyBackend, store: NamedStore, pod: Pod) -> Identity | BridgeError:
    try:
        return await backend.identify(store.plan, pod)
    except BridgeError as exc:
        return exc


def _refusal(plan: MountPlan, refused: list[tuple[NamedStore, BridgeError]]) -> BridgeError:
    """The error of a mount of a class of several stores whose stores refused to identify the
    pod: one naming every store that refused."""
    text = "; ".join(f"{s.label}: {err}" for s, err in refused)
    if any(isinstance(err, MissingCredential) for _, err in refused):
        text += f" (this class needs pod tokens for the audiences: {_audiences(plan.stores)})"
    # The code of the most actionable refusal, as MountFailed chooses it.
    code = MountFailed([(s.name, err) for s, err in refused]).code
    first = next(err for _, err in refused if err.code == code)
    return _restated(first, text)


def _audiences(stores: Sequence[NamedStore]) -> str:
    listed = [
        f"{audience!r} ({s.label})"
        for s in stores
        for audience in registry.dialect_module(s.plan.backend).audiences(s.plan.store)
    ]
    return ", ".join(listed) or "none"


async def _read(
    fetcher: Fetcher,
    read: StoreRead,
    refs: Sequence[Hashable],
    ctx: FetchContext,
    sources: dict[Hashable, Source] | None,
    owner: Owner,
) -> _Read:
    """One store's values, or its refusal as a whole (a login)."""
    if not refs:
        return {}
    try:
        return await fetcher.fetch(read, refs, ctx, sources, owner)
    except BridgeError as exc:
        return exc


def _per_ref(store: NamedStore, outcome: _Read) -> dict[Hashable, Fetched]:
    """A store's refusal as a whole fails each of its objects in a class of several stores;
    a one-store class answers it as it is."""
    if not isinstance(outcome, BridgeError):
        return outcome
    if not store.name:
        raise outcome
    return {spec.ref: outcome for spec in store.plan.objects}


async def _read_fallbacks(
    fetcher: Fetcher,
    stores: Sequence[NamedStore],
    reads: Sequence[StoreRead],
    wanted: dict[int, list[Fallback]],
    ctx: FetchContext,
    owner: Owner,
) -> dict[int, dict[Hashable, Fetched]]:
    if not wanted:
        return {}
    calls = []
    for index, fallbacks in wanted.items():
        plan = stores[index].fallback_plan
        assert plan is not None  # a store some object falls back to has one
        read = reads[index]._replace(plan=plan)
        calls.append(_read(fetcher, read, [f.spec.ref for f in fallbacks], ctx, None, owner))
    outcomes = await _together(calls)
    return {
        index: outcome
        if not isinstance(outcome, BridgeError)
        else dict.fromkeys((f.spec.ref for f in wanted[index]), outcome)
        for index, outcome in zip(wanted, outcomes, strict=True)
    }


def _use_fallback(
    gathered: Gathered,
    inputs: list[tuple[ObjectSpec[Any], Hashable]],
    store: NamedStore,
    spec: ObjectSpec[Any],
    not_found: NotFound,
    stores: Sequence[NamedStore],
    fallback: Fallback,
    second: dict[int, dict[Hashable, Fetched]],
    fetcher: Fetcher,
) -> None:
    other = stores[fallback.store]
    result = second[fallback.store][fallback.spec.ref]
    outcome = type(result).__name__ if isinstance(result, BridgeError) else "ok"
    fetcher.metrics.fallback_reads.labels(store.plan.backend, outcome).inc()
    if isinstance(result, NotFound) and spec.transforms.optional:
        gathered.absent.append(spec)
        return
    if isinstance(result, BridgeError):
        text = f"{not_found}; its fallback in {other.label}: {result}"
        gathered.failures.append(
            (failed_as(spec), _in_store(store, spec.name, _restated(result, text)))
        )
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
    inputs.append((fallback.spec, key))


def _absent(
    gathered: Gathered,
    spec: ObjectSpec[Any],
    index: int,
    sources: dict[Hashable, Source] | None,
) -> None:
    gathered.absent.append(spec)
    if sources is not None:
        sources[(index, spec.ref)] = "absent"


def _in_store(store: NamedStore, name: str, error: BridgeError) -> BridgeError:
    """`object 'x': in store 'aws': <cause>` (MountFailed keeps a cause that names its object);
    a one-store class's error as it is."""
    if not store.name:
        return error
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
