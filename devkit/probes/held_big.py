"""What held dynamic secrets of a few megabytes keep alive, and RSS at rest after a namespace's
mounts of them (issue 40, item 2; BENCHMARKS.md).

    python -m devkit.probes.held_big [--mounts 20] [--mib 3.8] [--shape keys|values]

A Vault stand-in (devkit/fakevault.py, in a process of its own) answers every read of
`dyn/creds/big` with a new lease (`lease_id`, an hour's `lease_duration`) and `data` of about
`--mib` MiB: `keys`, 16-byte values under some 35,000 keys per MiB (parsed, such an answer
costs several times its JSON), or `values`, 64 KiB strings. Each measurement runs in a fresh
process under the default flags: `--mounts` pods of one namespace mount the class one at a time
(each keeps its credential held: the lifetimes table), then a full collection, and RSS at rest
from /proc. Separately, with tracemalloc, the
Python heap one more held entry keeps alive (its values, parsed data, the answer memoized from
them), against what the table counts for it (`kept_size`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from aiohttp import web

from backends.vault.options import Options
from devkit.fakevault import FakeVault, login_ok
from devkit.testing import make_pod
from devkit.tokens import SigningKey
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import build_mounter
from provider.mount.lifetimes import kept_size
from provider.mount.mounting import MountInput


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


def payload(mib: float, shape: str) -> dict[str, Any]:
    size = int(mib * 2**20)
    if shape == "keys":
        return {f"k{i:07d}": "v" * 16 for i in range(size // 30)}
    return {f"k{i:04d}": "v" * 65536 for i in range(size // 65550)}


async def stand_in(mib: float, shape: str) -> None:
    """The Vault stand-in, in a process of its own (its buffers are not the provider's RSS):
    prints its address, serves until stdin closes."""
    data = payload(mib, shape)
    serial = itertools.count()

    async def creds(_request: web.Request) -> web.StreamResponse:
        body = {
            "request_id": "r",
            "lease_id": f"dyn/creds/big/{next(serial)}",
            "lease_duration": 3600,
            "renewable": True,
            "data": data,
        }
        return web.Response(body=json.dumps(body), content_type="application/json")

    vault = await FakeVault.start()
    vault.on("POST", "auth/jwt/login", login_ok())
    vault.on("GET", "dyn/creds/big", creds)
    print(vault.addr, flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await vault.stop()


async def run(mounts: int, mib: float, shape: str, traced: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "devkit.probes.held_big", "--child", "vault"]
    command += ["--mib", str(mib), "--shape", shape]
    vault = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert vault.stdout is not None and vault.stdin is not None
    address = vault.stdout.readline().strip()
    key = SigningKey.generate()
    with tempfile.TemporaryDirectory() as tmp:
        hmac_key = Path(tmp) / "hmac"
        hmac_key.write_bytes(b"k" * 32)
        settings = ServeSettings(
            hmac_key_file=str(hmac_key), core=CoreSettings(), backend_options={"vault": Options()}
        )
        mounter, backends = build_mounter(settings, Metrics())
        params = {
            "backend": "vault",
            "vaultAddress": address.replace("127.0.0.1", "localhost"),
            "roleName": "app",
            "vaultAuthMountPath": "jwt",
            "objects": "- {objectName: creds, secretPath: dyn/creds/big}",
        }
        token = key.pod_token("team-a", "app")

        async def mount(i: int) -> None:
            pod = make_pod(
                "team-a", "app", name=f"app-{i}", uid=f"uid-{i}", tokens={"vault": token}
            )
            await mounter.mount(MountInput(params, pod, permission=0o644))

        await mount(-1)  # imports, the plan, the login: not counted
        gc.collect()
        base = rss_mib()
        result: dict[str, Any] = {"shape": shape, "mounts": mounts, "rss_base_mib": round(base, 1)}
        if traced:
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            await mount(10_000)
            gc.collect()
            result["retained_per_entry_mib"] = round(
                (tracemalloc.get_traced_memory()[0] - before) / 2**20, 2
            )
            tracemalloc.stop()
        else:
            peak = base
            for i in range(mounts):
                await mount(i)
                peak = max(peak, rss_mib())
            gc.collect()
            await asyncio.sleep(1.0)
            result["rss_peak_mib"] = round(peak, 1)
            result["rss_at_rest_mib"] = round(rss_mib(), 1)
        lifetimes = mounter._fetcher._lifetimes  # a probe reads the table
        held = list(lifetimes._held.values())
        result["held_entries"] = len(held)
        result["held_counted_mib"] = round(lifetimes._bytes / 2**20, 1)
        result["counted_per_entry_mib"] = round(kept_size(held[-1].values) / 2**20, 2)
        result["answer_json_mib"] = round(len(held[-1].values[0].content) / 2**20, 2)
        await backends.close()
    vault.stdin.close()
    vault.wait()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mounts", type=int, default=20)
    parser.add_argument("--mib", type=float, default=3.8)
    parser.add_argument("--shape", choices=["keys", "values"], default=None)
    parser.add_argument("--child", choices=["rss", "traced", "vault"], default=None)
    args = parser.parse_args()
    if args.child == "vault":
        asyncio.run(stand_in(args.mib, args.shape))
        return
    if args.child:
        result = asyncio.run(run(args.mounts, args.mib, args.shape, args.child == "traced"))
        print(json.dumps(result))
        return
    for shape in [args.shape] if args.shape else ["keys", "values"]:
        for child in ("traced", "rss"):
            command = [sys.executable, "-m", "devkit.probes.held_big", "--child", child]
            command += ["--mounts", str(args.mounts), "--mib", str(args.mib), "--shape", shape]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            print(out.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
