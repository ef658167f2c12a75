"""Store calls per poll of a 50-secret selection against the same 50 secrets listed by name,
unchanged and with 5 rotated (BENCHMARKS.md): counted at the fake Google, every mount read
(the provider's cache off). `pytest -s` prints the table."""

from __future__ import annotations

from typing import Any

import aiohttp
import yaml

from tests.backends.gcp.conftest import Stack
from tests.backends.gcp.test_gcp_select import (
    KSA,
    PROJECT,
    Provider,
    calls,
    mount,
    providing,
    select,
)

N, CHANGED = 50, 5


async def polls(stack: Stack, stub: Any, params: dict[str, str]) -> list[dict[str, int]]:
    """Calls of a first mount, an unchanged poll, and a poll after CHANGED rotations."""
    counted = []
    for step in ("first", "unchanged", "changed"):
        if step == "changed":
            for i in range(CHANGED):
                stack.google.add_version(f"{PROJECT}/secrets/bench-{i:02}", f"v2-{i}")
        assert len(await mount(stub, params)) == N
        counted.append(calls(stack.google))
    return counted


async def test_calls_per_poll_of_a_selection_and_of_listed_objects(
    stack: Stack, tmp_path: Any
) -> None:
    provider: Provider = providing(stack, tmp_path)
    for i in range(N):
        stack.google.add_secret(f"{PROJECT}/secrets/bench-{i:02}", f"v1-{i}", KSA)
    listed = [
        {"resourceName": f"{PROJECT}/secrets/bench-{i:02}/versions/latest", "path": f"l/{i:02}"}
        for i in range(N)
    ]
    async with provider() as served:
        selection = await polls(
            stack,
            served.stub,
            select({"project": "proj", "namePrefix": "bench-", "directory": "s"}),
        )
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{served.health}/metrics") as resp:
                metrics = await resp.text()
        by_name = await polls(
            stack, served.stub, {"backend": "gcp", "secrets": yaml.safe_dump(listed)}
        )
    print(f"\ncalls per poll, {N} secrets (first / unchanged / {CHANGED} changed):")
    for label, counted in (("selection", selection), ("listed", by_name)):
        print(f"  {label:9}", " / ".join(f"{sum(c.values())} {c}" for c in counted))
    # Every poll lists, finds each secret's newest enabled version and reads it (a listing
    # proves permission to list, never to read: no value is reused on an unchanged version).
    every = {"ListSecrets": 1, "ListSecretVersions": N, "AccessSecretVersion": N}
    assert selection == [every] * 3
    # The provider counts the same calls by operation (docs/metrics.md).
    counts = (("ListSecrets", 3), ("ListSecretVersions", 3 * N), ("AccessSecretVersion", 3 * N))
    for operation, count in counts:
        series = f'backend="gcp",operation="{operation}",outcome="ok"}} {count}.0'
        assert series in metrics
    # Listed objects read each `versions/latest` at every poll, changed or not.
    assert by_name == [{"AccessSecretVersion": N}] * 3
