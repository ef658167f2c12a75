"""BENCHMARKS.md: Key Vault calls per poll of a 50-secret selection against the same 50 secrets
listed as objects, unchanged and with 5 changed (value cache off: every poll reads), counted at
the fake vault. `pytest -s` prints the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from devkit.serving import serving
from tests.backends.azure.conftest import CLIENT, TENANT, Azure
from tests.backends.azure.test_azure_fetch import objects
from tests.backends.azure.test_azure_select import Counter, mount, params

SECRETS = 50
CHANGED = 5


async def test_calls_per_poll_selection_against_listed_objects(
    azure: Azure, tmp_path: Path
) -> None:
    vault = azure.fake.vault("kvname", TENANT)
    vault.access[CLIENT] = "*"
    for i in range(SECRETS):
        vault.add("secret", f"app-{i:02d}", {"value": f"v{i}"})
    listed = objects(*(f"objectName: app-{i:02d}\nobjectType: secret" for i in range(SECRETS)))
    classes = {
        "selection": params({"namePrefix": "app-", "directory": "app"}),
        "listed": params(listed=listed),
    }
    count = Counter(azure.fake)
    rows: dict[str, list[tuple[int, int]]] = {}
    async with serving(tmp_path, backend_options={"azure": azure.options}) as provider:
        for name, parameters in classes.items():
            rows[name] = await polls(provider.stub, parameters, count, vault)
        async with aiohttp.ClientSession() as http, http.get(provider.health + "/metrics") as r:
            scraped = await r.text()
    print(f"\nKey Vault calls per poll, {SECRETS} secrets (listing pages, secret reads):")
    for name, (first, unchanged, changed) in rows.items():
        print(f"  {name:9} first {first}  unchanged {unchanged}  {CHANGED} changed {changed}")
    # A selection lists the vault (2 pages of 25) and reads every selected secret at every
    # poll (a listing proves permission to list, never to read).
    assert rows["selection"] == [(2, SECRETS)] * 3
    assert rows["listed"] == [(0, SECRETS), (0, SECRETS), (0, SECRETS)]
    # The provider counts the same calls (backend_call, docs/metrics.md).
    label = 'backend="azure",operation="secret.list",outcome="ok"'
    assert f"secrets_bridge_backend_calls_total{{{label}}} 6.0" in scraped
    reads = 'backend="azure",operation="secret.get",outcome="ok"'
    assert f"secrets_bridge_backend_calls_total{{{reads}}} {6 * SECRETS}.0" in scraped


async def polls(stub: Any, parameters: dict[str, str], count: Counter, vault: Any) -> list[Any]:
    """The calls of a first mount, an unchanged poll, and a poll after CHANGED new versions."""
    out = []
    for step in ("first", "unchanged", "changed"):
        if step == "changed":
            for i in range(CHANGED):
                vault.add("secret", f"app-{i:02d}", {"value": f"v{i}*"})
        files = await mount(stub, parameters)
        assert len(files) == SECRETS
        out.append(count.take())
    return out
