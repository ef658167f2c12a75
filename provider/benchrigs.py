"""Stores for `bench`: each rig starts (or prepares) a store, seeds it, tells the provider how
to reach it, and counts the calls the store served."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Protocol

import yaml

from provider.devstores import MotoDev, OpenBaoDev, PodTokens, free_port


class Rig(Protocol):
    provider_args: list[str]
    params: dict[str, str]

    def tokens(self, service_account: str) -> dict[str, str]: ...
    async def start(self) -> None: ...
    def store_calls(self) -> dict[str, int]: ...
    def free_port(self) -> int: ...
    async def stop(self) -> None: ...


class FakeRig:
    """The in-memory fake store; calls are read from the provider's own metrics."""

    def __init__(self, work: Path, objects: int) -> None:
        store = work / "fake-store.yaml"
        secrets = {f"s{i}": {"user": f"u{i}", "password": f"p{i}"} for i in range(objects)}
        store.write_text(yaml.safe_dump({"secrets": secrets}))
        self.health = free_port()
        self.provider_args = ["--enable-fake-backend", "--fake-store-file", str(store)]
        items = [{"objectName": f"o{i}", "secretPath": f"s{i}"} for i in range(objects)]
        self.params = {"backend": "fake", "objects": yaml.safe_dump(items)}

    def free_port(self) -> int:
        return self.health

    def tokens(self, service_account: str) -> dict[str, str]:
        return {}

    def store_calls(self) -> dict[str, int]:
        url = f"http://127.0.0.1:{self.health}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        total = 0
        for line in text.splitlines():
            if line.startswith('secrets_bridge_backend_calls_total{backend="fake"'):
                total += int(float(line.rsplit(" ", 1)[1]))
        return {"fake reads": total}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class OpenBaoRig:
    """A real OpenBao: jwt auth, one role for every bench identity, KV v2 secrets; calls
    counted in its audit log."""

    def __init__(self, work: Path, objects: int, identities: int) -> None:
        self.bao = OpenBaoDev(work)
        self.pod_tokens = PodTokens()
        self.objects, self.identities = objects, identities
        self.health = free_port()
        self.provider_args: list[str] = []
        items = [
            {
                "objectName": f"o{i}",
                "secretPath": f"secret/data/bench/s{i}",
                "secretKey": "password",
            }
            for i in range(objects)
        ]
        self.params = {
            "backend": "vault",
            "roleName": "bench",
            "vaultAuthMountPath": "jwt",
            "objects": yaml.safe_dump(items),
        }
        self._tokens: dict[str, str] = {}

    async def start(self) -> None:
        await self.bao.start()
        await self.bao.configure_jwt(self.pod_tokens)
        sas = [f"sa-{k}" for k in range(self.identities)]
        await self.bao.add_role("bench", "bench", sas, ["secret/data/bench/*"])
        for i in range(self.objects):
            await self.bao.kv_put(f"bench/s{i}", {"user": f"u{i}", "password": f"p{i}"})
        self.bao.audit_mark()
        self.provider_args = ["--vault-addr", self.bao.url]

    def free_port(self) -> int:
        return self.health

    def tokens(self, service_account: str) -> dict[str, str]:
        if service_account not in self._tokens:
            self._tokens[service_account] = self.pod_tokens.token("bench", service_account, "vault")
        return {"vault": self._tokens[service_account]}

    def store_calls(self) -> dict[str, int]:
        counts = self.bao.audit_counts()
        return {
            "logins": sum(n for k, n in counts.items() if k.endswith("auth/jwt/login")),
            "reads": sum(n for k, n in counts.items() if k.startswith("read ")),
        }

    async def stop(self) -> None:
        await self.bao.stop()


class MotoRig:
    """moto_server behind a counting proxy: IRSA (AssumeRoleWithWebIdentity) and Secrets
    Manager reads, counted on the wire by AWS operation."""

    def __init__(self, work: Path, objects: int, identities: int) -> None:
        self.moto = MotoDev(work)
        self.pod_tokens = PodTokens()
        self.objects = objects
        self.health = free_port()
        self.provider_args: list[str] = []
        items = [
            {"objectName": f"bench-s{i}", "objectType": "secretsmanager"} for i in range(objects)
        ]
        self.params = {
            "backend": "aws",
            "region": "us-east-1",
            "roleArn": "arn:aws:iam::123456789012:role/bench",
            "objects": yaml.safe_dump(items),
        }
        self._tokens: dict[str, str] = {}

    async def start(self) -> None:
        await self.moto.start()
        client = self.moto.client("secretsmanager")
        for i in range(self.objects):
            client.create_secret(
                Name=f"bench-s{i}", SecretString=f'{{"user": "u{i}", "password": "p{i}"}}'
            )
        self.moto.counts.clear()
        self.provider_args = [
            "--aws-region",
            "us-east-1",
            "--aws-endpoints",
            f"us-east-1={self.moto.url}",
            "--aws-sts-endpoint",
            self.moto.url,
        ]

    def free_port(self) -> int:
        return self.health

    def tokens(self, service_account: str) -> dict[str, str]:
        if service_account not in self._tokens:
            self._tokens[service_account] = self.pod_tokens.token(
                "bench", service_account, "sts.amazonaws.com"
            )
        return {"sts.amazonaws.com": self._tokens[service_account]}

    def store_calls(self) -> dict[str, int]:
        return dict(self.moto.counts)

    async def stop(self) -> None:
        await self.moto.stop()


def make_rig(store: str, work: Path, *, objects: int, identities: int) -> Rig:
    if store == "fake":
        return FakeRig(work, objects)
    if store == "openbao":
        return OpenBaoRig(work, objects, identities)
    if store == "moto":
        return MotoRig(work, objects, identities)
    raise SystemExit(f"bench: unknown store {store!r}")
