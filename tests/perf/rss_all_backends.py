"""Memory of one provider process with all four real backends active (a benchmark, not a test).

    .venv/bin/python -m tests.perf.rss_all_backends --mounts 10000

Starts OpenBao and moto (the bench rigs of devkit.rigs) and the wire-level Google and Azure
fakes (devkit.google, devkit.azure), runs `secrets-bridge serve` against all four, drives mounts
round-robin over one class per backend (5 objects each, value cache off, like upstream
providers) and prints the provider's RSS every `--every` mounts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from devkit.azure import FakeAzure, server_tls
from devkit.azure import start as start_azure
from devkit.google import POOL, FakeGoogle, start_http, start_secret_manager
from devkit.ports import free_port
from devkit.rigs import MotoRig, OpenBaoRig
from devkit.testing import driver_request
from provider.cli.bench import Run, drive, rss_mib, wait_ready

OBJECTS = 5
TENANT = "11111111-2222-3333-4444-555555555555"
CLIENT = "aaaaaaaa-0000-0000-0000-000000000001"
PROJECT, LOCATION, CLUSTER = "proj", "europe-west1", "c1"


async def google(work: Path) -> tuple[list[str], dict[str, str], dict[str, str], object]:
    sts = (
        f"identitynamespace:{POOL}:https://container.googleapis.com/v1/projects/{PROJECT}"
        f"/locations/{LOCATION}/clusters/{CLUSTER}"
    )
    fake = FakeGoogle(sts_audience=sts)
    fake.pod_tokens["gcp-pod-token"] = "bench/sa-0"
    fake.annotations["bench/sa-0"] = {}
    for i in range(OBJECTS):
        fake.add_version(f"projects/{PROJECT}/secrets/s{i}", f'{{"v": {i}}}', "ksa:bench/sa-0")
    server, port = await start_secret_manager(fake, "global", regional=False)
    runner, http = await start_http(fake)
    args = [
        "--gcp-project",
        PROJECT,
        "--gcp-location",
        LOCATION,
        "--gcp-cluster",
        CLUSTER,
        "--gcp-sts-endpoint",
        f"{http}/v1/token",
        "--gcp-iam-endpoint",
        http,
        "--gcp-secretmanager-endpoint",
        f"127.0.0.1:{port}",
        "--gcp-local-channel",
        "--kube-api-url",
        http,
    ]
    params = {
        "backend": "gcp",
        "secrets": yaml.safe_dump(
            [
                {
                    "resourceName": f"projects/{PROJECT}/secrets/s{i}/versions/latest",
                    "path": f"g{i}",
                }
                for i in range(OBJECTS)
            ]
        ),
    }
    return args, params, {POOL: "gcp-pod-token"}, (server, runner)


async def azure(work: Path) -> tuple[list[str], dict[str, str], dict[str, str], object]:
    tls = server_tls(work, prefix="az-")
    fake = FakeAzure()
    fake.federated[(TENANT, CLIENT)] = {"azure-pod-token"}
    vault = fake.vault("kvbench", TENANT)
    vault.access[CLIENT] = "*"
    for i in range(OBJECTS):
        vault.add("secret", f"s{i}", {"value": f"azure-{i}"})
    runner, port = await start_azure(fake, tls.context())
    args = ["--azure-ca-file", str(tls.ca_file), "--azure-connect-to", f"127.0.0.1:{port}"]
    objects = "array:\n" + "".join(
        f"  - |\n    objectName: s{i}\n    objectType: secret\n" for i in range(OBJECTS)
    )
    params = {
        "backend": "azure",
        "keyvaultName": "kvbench",
        "tenantID": TENANT,
        "clientID": CLIENT,
        "objects": objects,
    }
    return args, params, {"api://AzureADTokenExchange": "azure-pod-token"}, runner


def request(params: dict[str, str], tokens: dict[str, str], i: int) -> object:
    return driver_request(
        params,
        tokens=tokens,
        namespace="bench",
        service_account="sa-0",
        pod=f"pod-{i % 100}",
        spc="bench",
    )


async def main(mounts: int, every: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sb-rss-") as tmp:
        work = Path(tmp)
        bao, moto = OpenBaoRig(work, OBJECTS, 1, 0.0), MotoRig(work, OBJECTS)
        await bao.start()
        await moto.start()
        g_args, g_params, g_tokens, g_stop = await google(work)
        a_args, a_params, a_tokens, a_runner = await azure(work)
        classes = [
            (bao.params, bao.tokens("sa-0")),
            (moto.params, moto.tokens("sa-0")),
            (g_params, g_tokens),
            (a_params, a_tokens),
        ]
        requests = [request(*classes[i % 4], i) for i in range(mounts)]
        sock = str(work / "p.sock")
        key = work / "key"
        key.write_bytes(os.urandom(32))
        log = (work / "provider.log").open("wb")
        started = time.monotonic()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "provider.cli.main",
                "serve",
                "--socket",
                sock,
                "--health-addr",
                f"127.0.0.1:{free_port()}",
                "--hmac-key-file",
                str(key),
                "--log-level",
                "warning",
                *bao.provider_args,
                *moto.provider_args,
                *g_args,
                *a_args,
            ],
            stderr=log,
        )
        try:
            await wait_ready(sock, proc)
            print(
                f"start to ready {time.monotonic() - started:.2f}s, RSS {rss_mib(proc.pid):.0f} MiB"
            )
            total = Run("mount")
            for start in range(0, mounts, every):
                run = await drive(
                    sock, requests[start : start + every], concurrency, "mount", False
                )
                total.latencies += run.latencies
                for code, n in run.errors.items():
                    total.errors[code] = total.errors.get(code, 0) + n
                print(
                    f"after {start + every} mounts: RSS {rss_mib(proc.pid):.0f} MiB, "
                    f"p50 {run.summary()['p50_ms']:.1f} ms, errors {run.errors or 0}",
                    flush=True,
                )
            if total.errors:
                print((work / "provider.log").read_text()[-1500:])
        finally:
            proc.terminate()
            proc.wait(15)
            log.close()
            server, runner = g_stop  # type: ignore[misc]
            await server.stop(None)
            await runner.cleanup()
            await a_runner.cleanup()  # type: ignore[attr-defined]
            await bao.stop()
            await moto.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mounts", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=16)
    ns = parser.parse_args()
    asyncio.run(main(ns.mounts, ns.every, ns.concurrency))
