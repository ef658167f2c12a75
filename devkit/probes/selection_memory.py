"""What selections keep at rest (issue 40, item 2): after N one-at-a-time mounts of a large
selection of the fake store by one namespace, each by another service account (another identity,
so nothing is shared between them), under the default flags; the Python heap still allocated
after a full collection (tracemalloc) and the process's RSS, against the bytes one mount reads.

    python -m devkit.probes.selection_memory [--mounts 20] [--secrets 30] [--size 100000]
        [--store vault]

`--store vault`: the same against a real OpenBao (KV v2, its detailed-metadata listing granted:
the path on which selections used to hold their values, parsed answers included).

Runs against whatever tree it is started in (to compare with a base commit, run it there).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tempfile
import tracemalloc
from pathlib import Path

import yaml

from backends.vault.options import Options as VaultOptions
from devkit.openbao import OpenBao
from devkit.testing import Harness, make_pod
from devkit.tokens import SigningKey
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import build_mounter
from provider.mount.mounting import MountInput


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def _retained(mounts: int, secrets: int, size: int) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        harness = Harness(Path(tmp))
        harness.write({"secrets": {f"big/s{i:03}": "v" * size for i in range(secrets)}})
        select = yaml.safe_dump([{"prefix": "big/", "directory": "d"}])
        # One mount first, so that imports, the plan and the backend are not counted.
        warm = make_pod(service_account="warm", name="warm", uid="warm")
        await harness.mounter.mount(harness.request([], pod=warm, select=select))
        gc.collect()
        heap, rss = tracemalloc.get_traced_memory()[0], _rss()
        for i in range(mounts):
            pod = make_pod(service_account=f"sa-{i}", name=f"app-{i}", uid=f"uid-{i}")
            result = await harness.mounter.mount(harness.request([], pod=pod, select=select))
            assert len(result.files) == secrets
            del result
        gc.collect()
        out = {
            "heap_retained_bytes": tracemalloc.get_traced_memory()[0] - heap,
            "rss_growth_bytes": _rss() - rss,
        }
        await harness.backends.close()
        return out


GRANTS = """
path "secret/data/big/*" { capabilities = ["read"] }
path "secret/metadata/big/*" { capabilities = ["list"] }
path "secret/detailed-metadata/big/*" { capabilities = ["list"] }
"""


async def _vault_retained(mounts: int, secrets: int, size: int) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        bao = OpenBao.start(Path(tmp) / "openbao")
        try:
            key = SigningKey.generate()
            bao.configure_jwt_auth("jwt", key.public_pem)
            bao.put_policy("big", GRANTS)
            accounts = ["warm", *(f"sa-{i}" for i in range(mounts))]
            bao.add_jwt_role(
                "jwt", "big", namespace="default", service_account=accounts, policies=["big"]
            )
            for i in range(secrets):
                bao.kv2_put("secret", f"big/s{i:03}", {"v": "v" * size})
            hmac = Path(tmp) / "hmac"
            hmac.write_bytes(b"k" * 32)
            settings = ServeSettings(
                hmac_key_file=str(hmac),
                core=CoreSettings(),
                backend_options={"vault": VaultOptions(addr=bao.addr)},
            )
            mounter, backends = build_mounter(settings, Metrics())
            params = {
                "backend": "vault",
                "roleName": "big",
                "vaultAuthMountPath": "jwt",
                "select": yaml.safe_dump([{"path": "secret/big", "directory": "d"}]),
            }

            async def mount(account: str) -> None:
                token = key.pod_token("default", account, pod=account)
                pod = make_pod(service_account=account, name=account, uid=f"uid-{account}",
                               tokens={"vault": token})  # fmt: skip
                result = await mounter.mount(MountInput(params, pod, permission=0o644))
                assert len(result.files) == secrets

            await mount("warm")
            gc.collect()
            heap, rss = tracemalloc.get_traced_memory()[0], _rss()
            for account in accounts[1:]:
                await mount(account)
            gc.collect()
            out = {
                "heap_retained_bytes": tracemalloc.get_traced_memory()[0] - heap,
                "rss_growth_bytes": _rss() - rss,
            }
            await backends.close()
            return out
        finally:
            bao.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mounts", type=int, default=20)
    parser.add_argument("--secrets", type=int, default=30)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--store", choices=["fake", "vault"], default="fake")
    parser.add_argument("--no-tracemalloc", action="store_true", help="RSS only (no overhead)")
    args = parser.parse_args()
    if not args.no_tracemalloc:
        tracemalloc.start()
    measure = _vault_retained if args.store == "vault" else _retained
    got = asyncio.run(measure(args.mounts, args.secrets, args.size))
    per_mount = args.secrets * args.size
    print(json.dumps({**vars(args), "bytes_read_per_mount": per_mount, **got}))


if __name__ == "__main__":
    main()
