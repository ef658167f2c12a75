"""Held credentials against the tenants sharing the table and the store (issue 40, items 5 and
6), over the fake store's leases: another namespace's insert never evicts a namespace within its
fair share; a class's `renewAt` cannot make every poll a re-issue (the floor), but the floor
never lets a credential die under its pod; replaced credentials are revoked after the grace.
The same against real OpenBao: tests/backends/vault/test_vault_lease_floor.py."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from devkit.testing import Harness, make_pod
from provider.core.model import Pod

CREDS = [{"objectName": "creds", "secretPath": "db"}]


def store(**lease: Any) -> dict[str, Any]:
    return {"secrets": {"db": {"username": "app"}}, "leases": {"db": {"ttl": 3600, **lease}}}


def lease_of(files: dict[str, bytes]) -> str:
    return str(json.loads(files["creds"])["lease_id"])


def events(harness: Harness) -> dict[str, float]:
    return {
        sample.labels["event"]: sample.value
        for metric in harness.metrics.credential_events.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


async def poll(harness: Harness, pod: Pod, **params: str) -> str:
    result = await harness.mounter.mount(harness.request(CREDS, pod=pod, **params))
    return lease_of({f.path: f.contents for f in result.files})


async def test_an_insert_evicts_the_inserters_own_oldest_on_a_tie(tmp_path: Path) -> None:
    """A holds 2, B holds 2 of 4: B's third evicts B's own oldest, never A's."""
    harness = Harness(tmp_path, max_held_credentials=4)
    harness.write(store())
    try:
        a = [make_pod("team-a", "app", name=f"a-{i}", uid=f"a-{i}") for i in range(2)]
        b = [make_pod("team-b", "app", name=f"b-{i}", uid=f"b-{i}") for i in range(3)]
        held = {}
        for pod in [*a, *b[:2]]:  # A first: the old rule's tie went against whoever came first
            held[pod.uid] = await poll(harness, pod)
        await poll(harness, b[2])
        await asyncio.sleep(0.05)  # the revocation runs in the background
        assert events(harness)["evicted"] == 1.0
        assert harness.fake.revoked == [held["b-0"]]
        for pod in a:
            assert await poll(harness, pod) == held[pod.uid]  # A kept both, the same leases
        assert events(harness)["issued"] == 5.0
    finally:
        await harness.backends.close()


async def test_a_namespace_over_its_share_is_evicted_by_a_newcomer(tmp_path: Path) -> None:
    """A holds all 4: B's first takes A's least recently polled one (A is over its share)."""
    harness = Harness(tmp_path, max_held_credentials=4)
    harness.write(store())
    try:
        a = [make_pod("team-a", "app", name=f"a-{i}", uid=f"a-{i}") for i in range(4)]
        held = [await poll(harness, pod) for pod in a]
        await poll(harness, a[0])  # polled again: a-1 is now the least recently polled
        await poll(harness, make_pod("team-b", "app", name="b-0", uid="b-0"))
        await asyncio.sleep(0.05)
        assert harness.fake.revoked == [held[1]]
    finally:
        await harness.backends.close()


async def test_renew_at_cannot_make_every_poll_a_reissue(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`renewAt: "1e-9"` on an hour-long credential that cannot be renewed: under the default
    floor (300 s), 10 polls are one issuance; the class is warned about once."""
    harness = Harness(tmp_path)
    harness.write(store(renewable=False))
    try:
        pods = [make_pod(name=f"app-{i}", uid=f"uid-{i}") for i in range(2)]
        with caplog.at_level(logging.WARNING, "secrets_bridge.lifetimes"):
            for pod in pods:
                leases = {await poll(harness, pod, renewAt="1e-9") for _ in range(10)}
                assert len(leases) == 1
        assert events(harness)["issued"] == 2.0 and "reissued" not in events(harness)
        warnings = [r for r in caplog.records if "renewAt" in r.getMessage()]
        assert len(warnings) == 1
        assert "--min-renew-interval" in warnings[0].fields["why"]  # type: ignore[attr-defined]
    finally:
        await harness.backends.close()


async def test_the_floor_gives_way_to_a_short_life(tmp_path: Path) -> None:
    """A 1.5 s credential under the 300 s floor is still replaced at two thirds of its life,
    and no poll answers it past its end."""
    harness = Harness(tmp_path)
    harness.write(store(ttl=1.5, renewable=False))
    try:
        pod = make_pod()
        first = await poll(harness, pod, renewAt="1e-9")
        start = time.monotonic()
        changed = None
        while changed is None and time.monotonic() - start < 1.45:
            await asyncio.sleep(0.05)
            if await poll(harness, pod, renewAt="1e-9") != first:
                changed = time.monotonic() - start
        assert changed is not None and 0.9 <= changed <= 1.2
    finally:
        await harness.backends.close()


async def test_a_replaced_credential_is_revoked_after_the_grace(tmp_path: Path) -> None:
    """Re-issued every 0.3 s (the floor), each replaced lease is revoked 0.6 s later (the
    grace), not at once and not never: at most three are live at any poll."""
    harness = Harness(tmp_path, min_renew_interval=0.3, replaced_credential_grace=0.6)
    harness.write(store(renewable=False))
    try:
        pod = make_pod()
        seen: dict[str, float] = {}
        start = time.monotonic()
        while time.monotonic() - start < 2.5:
            lease = await poll(harness, pod, renewAt="1e-9")
            seen.setdefault(lease, time.monotonic())
            live = set(seen) - set(harness.fake.revoked)
            assert len(live) <= 3, f"leases piling up: {len(live)} live"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.7)
        issued = list(seen)
        assert len(issued) >= 5
        # Every replaced one revoked; the one held still live.
        assert set(harness.fake.revoked) == set(issued[:-1])
        assert events(harness)["revoked"] == len(issued) - 1
    finally:
        await harness.backends.close()


async def test_a_replaced_credential_that_ends_within_the_grace_is_left_to_end(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path)  # the 300 s grace; the credential lives 1.2 s
    harness.write(store(ttl=1.2, renewable=False))
    try:
        pod = make_pod()
        first = await poll(harness, pod)
        await asyncio.sleep(0.9)
        assert await poll(harness, pod) != first
        await asyncio.sleep(0.1)
        assert harness.fake.revoked == []
    finally:
        await harness.backends.close()


async def test_a_poll_renews_a_credential_that_would_end_before_the_next_poll(
    tmp_path: Path,
) -> None:
    """Polls every 0.55 s of a 1 s lease: its renewal point (0.67 s) falls between the polls at
    0.55 s and 1.1 s, and the second would find it dead; the provider renews it at a poll whose
    successor would come after its end."""
    harness = Harness(tmp_path, min_renew_interval=0.0)
    harness.write(store(ttl=1.0, max_ttl=30))
    try:
        pod = make_pod()
        first = await poll(harness, pod)
        for _ in range(5):
            await asyncio.sleep(0.55)
            assert await poll(harness, pod) == first  # renewed in time, never re-issued
        assert events(harness).get("expired") is None
        assert events(harness)["renewed"] >= 2
    finally:
        await harness.backends.close()
