"""What one held credential costs the provider's memory (BENCHMARKS.md, issue 31).

    python -m devkit.probes.held_memory --pods 2000

N pods each mount a class with one leased object of the fake store (a ~300-byte credential) and
keep it held (provider/mount/lifetimes.py); the Python heap that stays allocated after a full
collection (tracemalloc), divided by N, against the same N mounts of an unleased secret with
the value cache off, which hold nothing after their answer. Everything a held credential keeps
counts: its values, lifetime and handle, the table's entry, and the memoized answer its values
keep alive.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from devkit.testing import Harness, make_pod

CREDENTIAL = {"username": "v-app-" + "x" * 40, "password": "p" * 40, "note": "n" * 160}


async def _retained(pods: int, leased: bool) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        harness = Harness(Path(tmp), max_held_credentials=pods + 1)
        store: dict[str, Any] = {"secrets": {"db": CREDENTIAL}}
        if leased:
            store["leases"] = {"db": {"ttl": 3600, "max_ttl": 86400}}
        harness.write(store)
        objects = [{"objectName": "creds", "secretPath": "db"}]
        # One mount first, so that imports, the plan and the backend are not counted.
        await harness.mounter.mount(harness.request(objects, pod=make_pod(uid="warm")))
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(pods):
            pod = make_pod(name=f"app-{i}", uid=f"uid-{i}")
            await harness.mounter.mount(harness.request(objects, pod=pod))
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
        await harness.backends.close()
        return retained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=2000)
    args = parser.parse_args()
    tracemalloc.start()
    plain = asyncio.run(_retained(args.pods, leased=False))
    held = asyncio.run(_retained(args.pods, leased=True))
    content = len(json.dumps({"lease_id": "fake/db/1", "data": CREDENTIAL}))
    print(
        json.dumps(
            {
                "pods": args.pods,
                "credential_bytes": content,
                "retained_per_pod_plain_bytes": round(plain / args.pods),
                "retained_per_pod_held_bytes": round(held / args.pods),
                "per_held_credential_bytes": round((held - plain) / args.pods),
            }
        )
    )


if __name__ == "__main__":
    main()
