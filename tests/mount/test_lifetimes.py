"""The lifetime table (provider/mount/lifetimes.py) over the fake store's leases: what a pod's
polls get while its credential lasts, when its store fails or denies, how the table is shared
between namespaces, and what the value cache never holds. The Vault engines themselves, end to
end: tests/backends/vault/test_vault_lifetimes.py."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.fake import store as fake_store
from backends.fake.options import Options as FakeOptions
from devkit.testing import Harness, fetch_ctx, make_env, make_pod
from provider.core.errors import MountFailed
from provider.core.metrics import Metrics
from provider.core.model import Pod, SecretValue
from provider.mount.fetching import Fetcher
from provider.mount.lifetimes import Owner, kept_size
from provider.mount.planning import parse_plan
from provider.mount.reads import StoreRead

CREDS = [{"objectName": "creds", "secretPath": "db"}]
KV = [{"objectName": "config", "secretPath": "config"}]


def store(**lease: Any) -> dict[str, Any]:
    return {
        "secrets": {"db": {"username": "app"}, "config": "plain"},
        "leases": {"db": {"ttl": 1.5, "max_ttl": 30, "renewable": True, **lease}},
    }


def lease_of(files: dict[str, bytes]) -> str:
    return str(json.loads(files["creds"])["lease_id"])


def events(harness: Harness) -> dict[str, float]:
    return {
        sample.labels["event"]: sample.value
        for metric in harness.metrics.credential_events.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


async def poll(harness: Harness, pod: Pod, objects: list[dict[str, Any]] = CREDS, **params: str):
    result = await harness.mounter.mount(harness.request(objects, pod=pod, **params))
    return {f.path: f.contents for f in result.files}


@pytest.fixture
async def harness(tmp_path: Path):
    h = Harness(tmp_path, min_renew_interval=0.0)
    h.write(store())
    yield h
    await h.backends.close()


@pytest.mark.parametrize(("renew_at", "expected"), [(None, 1.0), ("1/2", 0.75)])
async def test_polls_get_the_held_credential_until_renew_at_then_a_renewal(
    harness: Harness, renew_at: str | None, expected: float
) -> None:
    pod = make_pod()
    params = {"renewAt": renew_at} if renew_at else {}
    first = await poll(harness, pod, **params)
    start = time.monotonic()
    renewed_at = None
    while time.monotonic() - start < 1.4:
        await asyncio.sleep(0.05)
        assert await poll(harness, pod, **params) == first
        if renewed_at is None and harness.fake.renewals:
            renewed_at = time.monotonic() - start
    assert renewed_at is not None and expected - 0.1 <= renewed_at <= expected + 0.15
    assert harness.fake.reads == {"db": 1}


async def test_a_failed_reissue_answers_the_held_credential_while_it_works(
    harness: Harness,
) -> None:
    harness.write(store(renewable=False))
    pod = make_pod()
    first = await poll(harness, pod)
    await asyncio.sleep(1.05)  # past two thirds of 1.5 s: due for a new one
    harness.write({**store(renewable=False), "failures": {"db": "unavailable"}})
    assert await poll(harness, pod) == first  # the store is down; the held one still works
    assert events(harness)["reused"] == 1.0
    await asyncio.sleep(0.5)  # past its end
    with pytest.raises(MountFailed, match="unavailable"):
        await poll(harness, pod)


async def test_a_denial_is_never_answered_with_the_held_credential(harness: Harness) -> None:
    harness.write(store(renewable=False))
    pod = make_pod()
    await poll(harness, pod)
    await asyncio.sleep(1.05)
    harness.write({**store(renewable=False), "failures": {"db": "denied"}})
    with pytest.raises(MountFailed, match="may not read"):
        await poll(harness, pod)
    # Dropped with the denial: the next poll, once allowed again, is a new credential.
    harness.write(store(renewable=False, ttl=30))
    assert (await poll(harness, pod))["creds"] != b""
    assert events(harness)["issued"] == 2.0


async def test_each_pod_holds_its_own_and_the_value_cache_never_holds_one(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path, cache_ttl=30.0)
    harness.write(store(ttl=30))
    try:
        pods = [make_pod(uid=f"uid-{i}", name=f"app-{i}") for i in range(3)]
        answers = await asyncio.gather(*(poll(harness, p, CREDS + KV) for p in pods))
        assert len({lease_of(a) for a in answers}) == 3
        assert {a["config"] for a in answers} == {b"plain"}
        # The plain object is read once and cached; the leased one once per pod.
        assert harness.fake.reads == {"db": 3, "config": 1}
        again = await asyncio.gather(*(poll(harness, p, CREDS + KV) for p in pods))
        assert again == answers
        assert harness.fake.reads == {"db": 3, "config": 1}
    finally:
        await harness.backends.close()


async def test_a_full_table_evicts_from_the_namespace_holding_the_most(tmp_path: Path) -> None:
    harness = Harness(tmp_path, max_held_credentials=4)
    harness.write(store(ttl=30))
    try:
        busy = [make_pod("busy", "app", name=f"b-{i}", uid=f"busy-{i}") for i in range(3)]
        quiet = [make_pod("quiet", "app", name=f"q-{i}", uid=f"quiet-{i}") for i in range(2)]
        held = {}
        for pod in [*busy, quiet[0]]:
            held[pod.uid] = await poll(harness, pod)
        await poll(harness, quiet[1])  # the table is full: busy's least recently polled goes
        await asyncio.sleep(0.05)  # its revocation runs in the background
        assert events(harness)["evicted"] == 1.0
        assert harness.fake.revoked == [lease_of(held["busy-0"])]
        assert await poll(harness, quiet[0]) == held["quiet-0"]  # quiet kept its own
        assert await poll(harness, busy[1]) == held["busy-1"]
    finally:
        await harness.backends.close()


@pytest.mark.parametrize(("revoke", "event"), [(True, "revoked"), (False, "revoke_refused")])
async def test_a_pod_that_stops_polling_is_let_go(tmp_path: Path, revoke: bool, event: str) -> None:
    harness = Harness(tmp_path, lease_idle_after=1.0)
    harness.write(store(ttl=30, revoke=revoke))
    try:
        pod = make_pod()
        first = await poll(harness, pod)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and event not in events(harness):
            await asyncio.sleep(0.1)
        assert events(harness)["idle"] == 1.0 and events(harness)[event] == 1.0
        assert harness.fake.revoked == ([lease_of(first)] if revoke else [])
        assert lease_of(await poll(harness, pod)) != lease_of(first)
    finally:
        await harness.backends.close()


async def test_the_table_is_bounded_in_bytes_by_namespace_share(tmp_path: Path) -> None:
    """A tenant sizes its dynamic secrets' answers: the bytes held are bounded too."""
    store_file = tmp_path / "store.yaml"
    big = {"secrets": {"db": "x" * 1000}, "leases": {"db": {"ttl": 30}}}
    store_file.write_text(yaml.safe_dump(big))
    backend = fake_store.create(make_env("fake", FakeOptions(store_file=str(store_file))))
    # What one of them keeps alive: the fake's answer (its lease id is as long as these).
    one = kept_size(
        [SecretValue(json.dumps({"lease_id": "fake/db/1", "data": "x" * 1000}).encode())]
    )
    fetcher = Fetcher(cache_ttl=0, metrics=Metrics(), max_bytes=4 * one + 50)  # four of them
    plan = parse_plan(
        {"backend": "fake", "objects": yaml.safe_dump(CREDS)},
        options_for=None,
        enable_test_stores=True,
    ).store
    refs = [spec.ref for spec in plan.objects]

    async def held(pod: Pod) -> str:
        identity = await backend.identify(plan, pod)
        owner = Owner(pod.uid, pod.namespace)
        fetched = await fetcher.fetch(
            StoreRead(backend, plan, identity), refs, fetch_ctx(), None, owner
        )
        (values,) = fetched.values()
        assert not isinstance(values, BaseException)
        return str(json.loads(values[0].content)["lease_id"])

    pods = [make_pod("busy", "app", name=f"b-{i}", uid=f"busy-{i}") for i in range(3)]
    pods += [make_pod("quiet", "app", name=f"q-{i}", uid=f"quiet-{i}") for i in range(2)]
    first = [await held(pod) for pod in pods[:4]]
    await held(pods[4])  # over the byte bound: busy (three of the five) gives up its oldest
    assert [await held(pod) for pod in pods[1:4]] == first[1:4]  # still held: the same lease
    assert await held(pods[0]) != first[0]  # evicted: a new one
    await fetcher.close()
