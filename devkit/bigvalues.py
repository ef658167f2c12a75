"""Hostile large answers against a real OpenBao, through a served provider (issue 40, items 1
and 3): one namespace's mounts of many large secrets, or of one secret of many keys, while
another namespace's pods mount too. Used by tests/backends/vault/test_vault_answer_bytes.py and
devkit/probes/answer_memory.py (before/after figures).

The attacker is namespace `attacker` with its own role over `kv1/attack/*`; the victim is
namespace `victim` over `kv1/victim/*`. Every mount goes through the driver's gRPC API. The
attacker's mounts run in a process of their own (`python -m devkit.bigvalues`), as another
pod's driver calls would: its client decoding 4 MB answers must not delay the victim's client.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from devkit.openbao_admin import Admin
from devkit.serving import driver_channel
from devkit.testing import driver_request
from devkit.tokens import SigningKey
from protos import provider_pb2_grpc

#: A secret just under one answer's budget (--max-response-bytes, 4 MiB): Vault's envelope
#: stays within the answer cap.
BIG = 3_900_000
#: One secret of this many JSON values, about 3.7 MB as Vault answers it (issue 40, item 3:
#: the issue's secret had 220,000 keys; OpenBao's listener refuses a write of that many strings
#: by default, so here they are numbers, which cost the parser about as much per byte).
VALUES = 220_000


def prepare(bao: Admin, key: SigningKey, selected: int = 20) -> None:
    """Policies, roles and secrets: `kv1/attack/big` (one secret near the budget),
    `kv1/attack/sel/s<i>` (`selected` of them), `kv1/attack/keys/one` (VALUES values) and the
    victim's small `kv1/victim/app`. Needs the `kv1` mount (KV version 1) and jwt auth."""
    bao.put_policy("attacker", 'path "kv1/attack/*" { capabilities = ["read", "list"] }\n')
    bao.put_policy("victim", 'path "kv1/victim/*" { capabilities = ["read"] }\n')
    for role in ("attacker", "victim"):
        bao.add_jwt_role("jwt", role, namespace=role, service_account="app", policies=[role])
    blob = {"blob": "x" * BIG}
    bao.kv1_put("kv1", "attack/big", blob)
    for i in range(selected):
        bao.kv1_put("kv1", f"attack/sel/s{i:03d}", blob)
    bao.kv1_put("kv1", "attack/keys/one", {"n": [i + 0.123456789 for i in range(VALUES)]})
    bao.kv1_put("kv1", "victim/app", {"password": "victim-secret"})


def _params(role: str, address: str, **more: str) -> dict[str, str]:
    return {
        "backend": "vault",
        "roleName": role,
        "vaultAddress": address,
        "vaultAuthMountPath": "jwt",
        **more,
    }


def many_objects(address: str, count: int = 100) -> dict[str, str]:
    """One class listing the same large secret `count` times (distinct queries: distinct reads)."""
    objects = [{"objectName": f"o{i}", "secretPath": f"kv1/attack/big?n={i}"} for i in range(count)]
    return _params("attacker", address, objects=yaml.safe_dump(objects))


def big_once(address: str) -> dict[str, str]:
    """One object: the large secret, read afresh at every mount (`{n}`: see many_values)."""
    objects = [{"objectName": "big", "secretPath": "kv1/attack/big?n={n}", "secretKey": "blob"}]
    return _params("attacker", address, objects=yaml.safe_dump(objects))


def many_values(address: str) -> dict[str, str]:
    """One object: the secret of VALUES values (`{n}` in its query is a fresh number at every
    mount, so that no mount is served from the value cache)."""
    objects = [{"objectName": "one", "secretPath": "kv1/attack/keys/one?n={n}"}]
    return _params("attacker", address, objects=yaml.safe_dump(objects))


def many_values_extracted(address: str) -> dict[str, str]:
    """As many_values, with a key extracted from it: the answer is parsed again to build the
    file (transforms), not only when read."""
    objects = [{"objectName": "one", "secretPath": "kv1/attack/keys/one?n={n}", "secretKey": "n"}]
    return _params("attacker", address, objects=yaml.safe_dump(objects))


def selecting(address: str, path: str = "kv1/attack/sel") -> dict[str, str]:
    return _params("attacker", address, select=yaml.safe_dump([{"path": path}]))


def victim(address: str) -> dict[str, str]:
    objects = [{"objectName": "password", "secretPath": "kv1/victim/app", "secretKey": "password"}]
    return _params("victim", address, objects=yaml.safe_dump(objects))


@dataclass
class Outcome:
    """What the attack's and the victim's mounts got."""

    attacker: dict[str, int] = field(default_factory=dict)
    #: The attacker's refusals' messages (one of each) by status.
    messages: dict[str, list[str]] = field(default_factory=dict)
    victim_ok: int = 0
    victim_failed: list[str] = field(default_factory=list)
    #: Each victim mount's seconds.
    latencies: list[float] = field(default_factory=list)

    def p99(self) -> float:
        if len(self.latencies) < 2:
            return max(self.latencies, default=0.0)
        return statistics.quantiles(self.latencies, n=100)[98]


class Driver:
    """The driver's client for the served provider."""

    def __init__(self, socket: str) -> None:
        self._channel = driver_channel(socket)
        self._stub: Any = provider_pb2_grpc.CSIDriverProviderStub(self._channel)

    async def mount(
        self, params: dict[str, str], namespace: str, token: str, pod: str, timeout: float = 60
    ) -> Any:
        request = driver_request(
            params, tokens={"vault": token}, namespace=namespace, pod=pod, service_account="app"
        )
        return await self._stub.Mount(request, timeout=timeout, wait_for_ready=True)

    async def close(self) -> None:
        await self._channel.close()


async def attack(
    socket: str,
    key: SigningKey,
    attacker: dict[str, str],
    victim_params: dict[str, str],
    workdir: Path,
    *,
    threads: int = 2,
    seconds: float = 8.0,
    victim_gap: float = 0.02,
    pythonpath: str = "",
) -> Outcome:
    """`threads` loops of the attacker's mounts for `seconds` (in a process of their own),
    while the victim mounts every `victim_gap` seconds (its first mount before the attack:
    its later ones are cached when the provider caches)."""
    out = Outcome()
    driver = Driver(socket)
    token = key.pod_token("victim", "app")
    try:
        await driver.mount(victim_params, "victim", token, "v")
        spec = workdir / "attacker.json"
        spec.write_text(
            json.dumps(
                {
                    "socket": socket,
                    "params": attacker,
                    "token": key.pod_token("attacker", "app"),
                    "threads": threads,
                    "seconds": seconds,
                }
            )
        )
        env = {"PYTHONPATH": pythonpath} if pythonpath else None
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "devkit.bigvalues", str(spec), stdout=-1, env=env
        )
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            began = time.monotonic()
            try:
                got = await driver.mount(victim_params, "victim", token, "v")
                contents = [f.contents for f in got.files]
                if contents == [b"victim-secret"]:
                    out.victim_ok += 1
                else:
                    out.victim_failed.append(f"wrong files: {len(contents)}")
            except grpc.aio.AioRpcError as exc:
                out.victim_failed.append(exc.details() or exc.code().name)
            out.latencies.append(time.monotonic() - began)
            await asyncio.sleep(victim_gap)
        stdout, _ = await process.communicate()
        report = json.loads(stdout)
        out.attacker, out.messages = report["codes"], report["messages"]
    finally:
        await driver.close()
    return out


async def one_at_a_time(
    socket: str, key: SigningKey, params: dict[str, str], count: int = 20
) -> None:
    """`count` mounts of the attacker's, one after the other, each a fresh number in the
    class's `{n}` (each value read, parsed and cached anew)."""
    driver = Driver(socket)
    token = key.pod_token("attacker", "app")
    try:
        for i in range(count):
            mine = {k: v.replace("{n}", str(i)) for k, v in params.items()}
            await driver.mount(mine, "attacker", token, f"a{i}")
    finally:
        await driver.close()


async def _attacking(spec: dict[str, Any]) -> dict[str, Any]:
    driver = Driver(spec["socket"])
    codes: dict[str, int] = {}
    messages: dict[str, set[str]] = {}
    stop = time.monotonic() + spec["seconds"]
    serial = itertools.count()

    async def one_thread(n: int) -> None:
        while time.monotonic() < stop:
            params = {k: v.replace("{n}", str(next(serial))) for k, v in spec["params"].items()}
            try:
                # Cut at the attack's end: a mount waiting for its share does not outlast it.
                left = max(0.5, stop - time.monotonic() + 1)
                await driver.mount(params, "attacker", spec["token"], f"a{n}", timeout=left)
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
                messages.setdefault(code, set()).add(exc.details() or "")
            codes[code] = codes.get(code, 0) + 1

    try:
        await asyncio.gather(*(one_thread(n) for n in range(spec["threads"])))
    finally:
        await driver.close()
    return {"codes": codes, "messages": {c: sorted(m) for c, m in messages.items()}}


if __name__ == "__main__":
    task = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps(asyncio.run(_attacking(task))))
