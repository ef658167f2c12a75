"""Store calls per poll of 50 KV secrets, selected or listed as 50 objects, unchanged and with 5
changed, counted in the real OpenBao's audit log (BENCHMARKS.md, "Selectors: store calls per
poll"). Run with -s to see the table:

    .venv/bin/pytest -q -s tests/backends/vault/test_vault_select_bench.py
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import yaml

from devkit.openbao import OpenBao
from devkit.tokens import SigningKey
from tests.backends.vault.test_vault_select import Mounts, kv2, roles

__all__ = ["roles"]  # the policies and roles fixture

N, CHANGED = 50, 5


async def polls(
    openbao: OpenBao, mount: Callable[[], Awaitable[object]], change: Callable[[int], None]
) -> tuple[int, int, int]:
    """Store calls of the first poll, of an unchanged one, and of one after CHANGED writes."""
    counts = []
    for step in range(3):
        if step == 2:
            for i in range(CHANGED):
                change(i)
        openbao.audit_mark()
        await mount()
        counts.append(sum(openbao.audit_counts().values()))
    return counts[0], counts[1], counts[2]


async def test_calls_per_poll_of_a_selection_and_of_listed_objects(
    openbao: OpenBao, signing_key: SigningKey, tmp_path: Path, roles: None
) -> None:
    kv2(openbao, {f"sel/bench/s{i:02}": {"v": 0} for i in range(N)})
    for i in range(N):
        openbao.kv1_put("kv1", f"sel/bench/s{i:02}", {"v": 0})
    objects = yaml.safe_dump(
        [
            {"objectName": f"s{i:02}", "secretPath": f"secret/data/sel/bench/s{i:02}"}
            for i in range(N)
        ]
    )

    def v2(i: int) -> None:
        kv2(openbao, {f"sel/bench/s{i:02}": {"v": "new"}})

    def v1(i: int) -> None:
        openbao.kv1_put("kv1", f"sel/bench/s{i:02}", {"v": "new"})

    harness = Mounts(openbao, signing_key, tmp_path, max_objects=N)
    try:
        rows = {
            "KV v2 selection (OpenBao, detailed listing)": await polls(
                openbao, lambda: harness.mount({"path": "secret/sel/bench", "directory": "d"}), v2
            ),
            "KV v2 selection (metadata listing only)": await polls(
                openbao,
                lambda: harness.mount(
                    {"path": "secret/sel/bench", "directory": "d"}, role="plainselect"
                ),
                v2,
            ),
            "KV v1 selection": await polls(
                openbao, lambda: harness.mount({"path": "kv1/sel/bench", "directory": "d"}), v1
            ),
            "50 listed objects": await polls(
                openbao, lambda: harness.mount(objects=objects, role="plainselect"), v2
            ),
        }
    finally:
        await harness.backends.close()
    print(f"\nstore calls per poll, {N} secrets: first / unchanged / {CHANGED} changed")
    for name, (first, same, changed) in rows.items():
        print(f"  {name:45} {first:3} / {same:3} / {changed:3}")
    # First polls: a login (once per role: the others reuse its token), the mount's answer,
    # the listing (after the refused detailed one, for a role without that grant), the reads.
    # Every later poll: the listing and a read of every selected secret (a listing proves
    # permission to list, never to read), the mount's answer held for MOUNT_TTL.
    assert rows == {
        "KV v2 selection (OpenBao, detailed listing)": (1 + 1 + 1 + N, 1 + N, 1 + N),
        "KV v2 selection (metadata listing only)": (1 + 1 + 2 + N, 1 + N, 1 + N),
        "KV v1 selection": (1 + 1 + N, 1 + N, 1 + N),
        "50 listed objects": (N, N, N),
    }
