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
from tests.mount.test_outages import PLAN, rig, who


async def test_a_namespace_holding_its_share_of_hung_reads_does_not_stall_another() -> None:
    fetcher, store, _ = rig(
        store_call_timeout=30, max_concurrent_fetches=8, max_concurrent_fetches_per_namespace=2
    )
    store.hang_namespaces = {"b"}
    # 64 volumes of B, each its own identity, against B's store that never answers a read.
    attack = [
        asyncio.create_task(fetcher.fetch(store, PLAN, who("b", f"sa{i}"), ["r"], fetch_ctx(30)))
        for i in range(64)
    ]
    await asyncio.sleep(0.1)
    start = time.monotonic()
    result = await fetcher.fetch(store, PLAN, who("a"), ["r"], fetch_ctx(5))
    assert result["r"][0].content == b"v1"  # type: ignore[index]
    assert time.monotonic() - start < 0.2
    assert store.peak["b"] == 2  # B never held more than its share
    for task in attack:
        task.cancel()
    await asyncio.gather(*attack, return_exceptions=True)
    await fetcher.close()


async def test_without_a_share_the_same_attack_takes_every_slot() -> None:
    # The contrast: with a namespace's share equal to the whole pool, A has to wait.
    fetcher, store, _ = rig(
        store_call_timeout=30, max_concurrent_fetches=8, max_concurrent_fetches_per_namespace=8
    )
    store.hang_namespaces = {"b"}
    attack = [
        asyncio.create_task(fetcher.fetch(store, PLAN, who("b", f"sa{i}"), ["r"], fetch_ctx(30)))
        for i in range(64)
    ]
    await asyncio.sleep(0.1)
    result = await fetcher.fetch(store, PLAN, who("a"), ["r"], fetch_ctx(0.5))
    assert "did not answer" in str(result["r"])
    for task in attack:
        task.cancel()
    await asyncio.gather(*attack, return_exceptions=True)
    await fetcher.close()


async def test_slots_of_namespaces_that_come_and_go_are_forgotten() -> None:
    slots = FetchSlots(4, 2)
    for i in range(100):
        async with slots.hold("vault", f"ns{i}"):
            pass
    assert not slots._namespaces and not slots._users


async def test_large_values_of_b_do_not_evict_as_values_or_stale_copies() -> None:
    fetcher, store, _ = rig(
        cache_ttl=60,
        max_entries=1000,
        max_bytes=256 * 1024,
        serve_stale_max_age=600,
        serve_stale_wait=0.2,
    )
    for ref in ("a1", "a2", "a3"):
        await fetcher.fetch(store, PLAN, who("a"), [ref], fetch_ctx(5))
    calls = store.calls
    store.value = b"x" * 16 * 1024
    for i in range(200):  # 3 MiB of B's values through a 256 KiB cache
        await fetcher.fetch(store, PLAN, who("b", f"sa{i % 7}"), [f"big{i}"], fetch_ctx(5))
    assert fetcher._cache.usage("b")[1] <= 256 * 1024
    # A's values are still cached...
    store.value = b"v-new"
    results = await fetcher.fetch(store, PLAN, who("a"), ["a1", "a2", "a3"], fetch_ctx(5))
    assert {r[0].content for r in results.values()} == {b"v1"}  # type: ignore[index]
    assert store.calls == calls + 200
    # ...and so are its stale copies: with the cache expired and the store hanging, A is served.
    for ref in ("a1", "a2", "a3"):
        fetcher._cache.invalidate((who("a").key, ref))
    store.hanging = True
    results = await fetcher.fetch(store, PLAN, who("a"), ["a1", "a2", "a3"], fetch_ctx(5))
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
            params, options_for=lambda _n: VaultOptions(), enable_fake=False, max_objects=10
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
        *(fetcher.fetch(store, PLAN, who("a", f"sa{i}"), ["r"], fetch_ctx(5)) for i in range(32))
    )
    assert store.peak["a"] == 16 and time.monotonic() - start < 0.5
