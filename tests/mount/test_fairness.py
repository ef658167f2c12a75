"""Fair shares between namespaces (issue 20): fetch slots, the value, stale and credential caches.

One provider serves every namespace of the node; namespace B must not be able to stall A's
mounts by holding every fetch slot with reads its own store never answers, nor evict A's cached
values, stale copies or credentials by filling the caches with its own.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from backends.vault.options import Options as VaultOptions
from devkit.testing import fetch_ctx, make_env, make_pod
from provider.core.caching import ExpiringCache
from provider.core.limits import FetchSlots, namespace_of
from provider.core.model import SecretValue, identity_key
from provider.mount.fetching import Fetcher
from provider.mount.planning import parse_plan
from provider.mount.reads import StoreRead
from tests.mount.test_outages import PLAN, rig, who


async def test_a_namespace_holding_its_share_of_hung_reads_does_not_stall_another() -> None:
    fetcher, store, _ = rig(
        store_call_timeout=30, max_concurrent_fetches=8, max_concurrent_fetches_per_namespace=2
    )
    store.hang_namespaces = {"b"}
    # 64 volumes of B, each its own identity, against B's store that never answers a read.
    attack = [
        asyncio.create_task(
            fetcher.fetch(StoreRead(store, PLAN, who("b", f"sa{i}")), ["r"], fetch_ctx(30))
        )
        for i in range(64)
    ]
    await asyncio.sleep(0.1)
    start = time.monotonic()
    result = await fetcher.fetch(StoreRead(store, PLAN, who("a")), ["r"], fetch_ctx(5))
    assert result["r"][0].content == b"v1"  # type: ignore[index]
    assert time.monotonic() - start < 0.2
    assert store.peak["b"] == 2  # B never held more than its share
    for task in attack:
        task.cancel()
    await asyncio.gather(*attack, return_exceptions=True)
    await fetcher.close()


@pytest.mark.parametrize(
    ("attackers", "loads_each", "share", "hung"),
    [(4, 16, 16, 64), (100, 1, 16, 100), (1, 64, 64, 64)],
)
async def test_no_set_of_namespaces_takes_every_slot_from_another(
    attackers: int, loads_each: int, share: int, hung: int
) -> None:
    """Issue 32, attack 1: four namespaces at their full share hold all 64 slots; a hundred
    namespaces hold one each; one namespace's share is the whole pool. A namespace with
    nothing in flight is served at once in each."""
    fetcher, store, _ = rig(
        store_call_timeout=30, max_concurrent_fetches=64, max_concurrent_fetches_per_namespace=share
    )
    hostile = {f"b{i}" for i in range(attackers)}
    store.hang_namespaces = hostile
    attack = [
        asyncio.create_task(
            fetcher.fetch(StoreRead(store, PLAN, who(ns, f"sa{i}")), ["r"], fetch_ctx(30))
        )
        for ns in hostile
        for i in range(loads_each)
    ]
    await asyncio.sleep(0.1)
    # Every slot is held by a hung read (a hundred first loads go over the total of 64).
    assert sum(store.inflight.get(ns, 0) for ns in hostile) == hung
    start = time.monotonic()
    result = await fetcher.fetch(StoreRead(store, PLAN, who("a")), ["r"], fetch_ctx(5))
    assert result["r"][0].content == b"v1"  # type: ignore[index]
    assert time.monotonic() - start < 1.0  # the hung reads hold their slots for 30 s
    for task in attack:
        task.cancel()
    await asyncio.gather(*attack, return_exceptions=True)
    await fetcher.close()


async def test_a_second_load_of_a_namespace_keeps_the_total() -> None:
    """The first-slot rule is for namespaces with nothing in flight: a busy namespace's next
    load waits for the total like any other (a rollout still respects the store's quota)."""
    slots = FetchSlots(2, 2)
    async with slots.hold("vault", "b"), slots.hold("vault", "c"):
        async with slots.hold("vault", "a"):  # a's first: admitted over the total
            waiting = asyncio.create_task(_held(slots, "a"))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # a's second waits for the total
        await asyncio.sleep(0.05)
        assert waiting.done()  # a has nothing in flight again: its first is admitted
    assert not slots._namespaces


async def _held(slots: FetchSlots, namespace: str) -> None:
    async with slots.hold("vault", namespace):
        pass


async def test_a_slot_is_not_held_while_a_retry_waits() -> None:
    """A refusing store's backoff holds no slot: with one slot, a second namespace's load runs
    while the first waits to retry."""
    fetcher, store, _ = rig(max_concurrent_fetches=1, max_concurrent_fetches_per_namespace=1)
    store.refusing = True
    failing = asyncio.create_task(
        fetcher.fetch(StoreRead(store, PLAN, who("b")), ["r"], fetch_ctx(6))
    )
    await asyncio.sleep(0.05)  # b's first attempt was refused; it waits to retry
    slots = fetcher._loads._slots
    assert slots._in_use.get("hang", 0) == 0
    failing.cancel()
    await asyncio.gather(failing, return_exceptions=True)
    await fetcher.close()


async def test_slots_of_namespaces_that_come_and_go_are_forgotten() -> None:
    slots = FetchSlots(4, 2)
    for i in range(100):
        async with slots.hold("vault", f"ns{i}"):
            pass
    assert not slots._namespaces and slots._in_use == {"vault": 0}


async def test_large_values_of_b_do_not_evict_as_values_or_stale_copies() -> None:
    fetcher, store, _ = rig(
        cache_ttl=60,
        max_entries=1000,
        max_bytes=256 * 1024,
        serve_stale_max_age=600,
        serve_stale_wait=0.2,
    )
    for ref in ("a1", "a2", "a3"):
        await fetcher.fetch(StoreRead(store, PLAN, who("a")), [ref], fetch_ctx(5))
    calls = store.calls
    store.value = b"x" * 16 * 1024
    for i in range(200):  # 3 MiB of B's values through a 256 KiB cache
        await fetcher.fetch(
            StoreRead(store, PLAN, who("b", f"sa{i % 7}")), [f"big{i}"], fetch_ctx(5)
        )
    assert fetcher._cache.usage("b")[1] <= 256 * 1024
    # A's values are still cached...
    store.value = b"v-new"
    results = await fetcher.fetch(
        StoreRead(store, PLAN, who("a")), ["a1", "a2", "a3"], fetch_ctx(5)
    )
    assert {r[0].content for r in results.values()} == {b"v1"}  # type: ignore[index]
    assert store.calls == calls + 200
    # ...and so are its stale copies: with the cache expired and the store hanging, A is served.
    for ref in ("a1", "a2", "a3"):
        fetcher._cache.invalidate((who("a").key, ref))
    store.hanging = True
    results = await fetcher.fetch(
        StoreRead(store, PLAN, who("a")), ["a1", "a2", "a3"], fetch_ctx(5)
    )
    assert {r[0].content for r in results.values()} == {b"v1"}  # type: ignore[index]
    await fetcher.close()


def test_throwaway_identities_do_not_evict_anothers_credentials() -> None:
    credentials: ExpiringCache[str] = ExpiringCache(max_entries=100, tenant_of=namespace_of)
    a_key = identity_key("vault", "https://vault", "-", "jwt", "app", "vault", "a/app")
    credentials.put(a_key, "a-token", 3600)
    for i in range(10_000):  # B's throwaway roles, each its own identity
        credentials.put(identity_key("vault", "x", "-", "jwt", f"r{i}", "vault", "b/sa"), "t", 3600)
    assert credentials.get(a_key) == "a-token"
    assert len(credentials) == 100 and credentials.usage("b")[0] == 99


def test_each_namespace_keeps_at_least_its_even_share_of_bytes() -> None:
    cache: ExpiringCache[bytes] = ExpiringCache(
        max_entries=1000, max_bytes=1000, size_of=len, tenant_of=namespace_of
    )
    for i in range(6):  # A: 600 bytes, more than half
        cache.put(("x|a/app", f"a{i}"), b"a" * 100, 60)
    for i in range(30):  # B pushes: A gives way down to an even split, not below
        cache.put(("x|b/app", f"b{i}"), b"b" * 100, 60)
    assert cache.usage("a") == (5, 500) and cache.usage("b") == (5, 500)


@pytest.mark.parametrize("scope", ["serviceaccount", "pod"])
async def test_identity_keys_name_the_pods_namespace(tmp_path: Path, scope: str) -> None:
    from backends import registry

    pod = make_pod(namespace="team-a", service_account="app", tokens={"vault": "jwt"})
    params = {
        "backend": "vault",
        "roleName": "r|x/y",  # a pod author's attempt to look like another namespace
        "vaultAddress": "https://vault|evil/app",
        "objects": "- {objectName: o, secretPath: secret/data/o}",
    }
    env = make_env("vault", VaultOptions(), cache_scope=scope)
    backend = registry.create(env)
    try:
        plan = parse_plan(
            params, options_for=lambda _n: VaultOptions(), enable_test_stores=False, max_objects=10
        )
        identity = await backend.identify(plan.store, pod)
    finally:
        await backend.close()
    assert namespace_of(identity.key) == "team-a"
    assert namespace_of((identity.key, "ref")) == "team-a"


def test_the_same_value_object_is_shared_not_copied() -> None:
    # Sizes are charged per entry; a value shared by several keys is counted each time, which
    # errs on the side of evicting the namespace that holds it.
    cache: ExpiringCache[list[SecretValue]] = ExpiringCache(
        max_bytes=100, size_of=lambda v: sum(len(x.content) for x in v), tenant_of=namespace_of
    )
    value = [SecretValue(b"z" * 40)]
    cache.put(("x|a/app", 1), value, 60)
    cache.put(("x|a/app", 2), value, 60)
    cache.put(("x|a/app", 3), value, 60)
    assert cache.usage("a") == (2, 80)


async def test_fetcher_fair_slots_do_not_slow_a_single_namespace_rollout() -> None:
    # One namespace alone still gets its share at once: a cold rollout of 32 identities.
    fetcher: Fetcher
    fetcher, store, _ = rig(max_concurrent_fetches=64, max_concurrent_fetches_per_namespace=16)
    store.delay = 0.05
    start = time.monotonic()
    await asyncio.gather(
        *(
            fetcher.fetch(StoreRead(store, PLAN, who("a", f"sa{i}")), ["r"], fetch_ctx(5))
            for i in range(32)
        )
    )
    assert store.peak["a"] == 16 and time.monotonic() - start < 0.5
