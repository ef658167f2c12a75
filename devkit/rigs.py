"""Stores for `bench`: each rig starts (or prepares) a store, seeds it, tells the provider how
to reach it, and counts the calls the store served (on the store's side where it can)."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Protocol

import yaml

from devkit.devstores import FaultProxy, MotoDev, OpenBaoDev, PodTokens


class Rig(Protocol):
    name: str
    provider_args: list[str]
    params: dict[str, str]

    def tokens(self, service_account: str) -> dict[str, str]: ...
    async def start(self) -> None: ...
    def store_calls(self) -> dict[str, int]: ...
    async def stop(self) -> None: ...


class FakeRig:
    """The in-memory fake store; its reads are read from the provider's own metrics."""

    name = "fake"

    def __init__(self, work: Path, objects: int, health_port: int) -> None:
        store = work / "fake-store.yaml"
        secrets = {f"s{i}": {"user": f"u{i}", "password": f"p{i}"} for i in range(objects)}
        store.write_text(yaml.safe_dump({"secrets": secrets}))
        self.health = health_port
        self.provider_args = ["--enable-fake-backend", "--fake-store-file", str(store)]
        items = [{"objectName": f"o{i}", "secretPath": f"s{i}"} for i in range(objects)]
        self.params = {"backend": "fake", "objects": yaml.safe_dump(items)}

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
        return {"reads": total}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class OpenBaoRig:
    """A real OpenBao: jwt auth, one role for every bench identity, KV v2 secrets; calls
    counted in its audit log. With an error rate, a proxy in front answers that share of
    requests with 429 (Retry-After: 0) — a throttling Vault."""

    name = "openbao"

    def __init__(self, work: Path, objects: int, identities: int, error_rate: float) -> None:
        self.bao = OpenBaoDev(work)
        self.proxy: FaultProxy | None = None
        self.error_rate = error_rate
        self.pod_tokens = PodTokens()
        self.objects, self.identities = objects, identities
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
        url = self.bao.url
        if self.error_rate > 0:
            self.proxy = FaultProxy(self.bao.url)
            self.proxy.error_rate = self.error_rate
            await self.proxy.start()
            url = self.proxy.url
        self.provider_args = ["--vault-addr", url]

    def tokens(self, service_account: str) -> dict[str, str]:
        if service_account not in self._tokens:
            self._tokens[service_account] = self.pod_tokens.token("bench", service_account, "vault")
        return {"vault": self._tokens[service_account]}

    def store_calls(self) -> dict[str, int]:
        counts = self.bao.audit_counts()
        calls = {
            "logins": sum(n for k, n in counts.items() if k.endswith("auth/jwt/login")),
            "reads": sum(n for k, n in counts.items() if k.startswith("read ")),
        }
        if self.proxy is not None:
            calls["requests"] = self.proxy.calls
            calls["answered 429"] = self.proxy.injected
        return calls

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
        await self.bao.stop()


class MotoRig:
    """moto_server behind a counting proxy: IRSA (AssumeRoleWithWebIdentity) and Secrets
    Manager reads, counted on the wire by AWS operation."""

    name = "moto"

    def __init__(self, work: Path, objects: int) -> None:
        self.moto = MotoDev(work)
        self.pod_tokens = PodTokens()
        self.objects = objects
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


STORES = ("fake", "openbao", "moto")


def make_rigs(
    stores: list[str],
    work: Path,
    *,
    objects: int,
    identities: int,
    health_port: int,
    error_rate: float = 0.0,
) -> list[Rig]:
    rigs: list[Rig] = []
    for store in stores:
        if store == "fake":
            rigs.append(FakeRig(work, objects, health_port))
        elif store == "openbao":
            rigs.append(OpenBaoRig(work, objects, identities, error_rate))
        elif store == "moto":
            rigs.append(MotoRig(work, objects))
        else:
            raise SystemExit(f"bench: unknown store {store!r}; choose from {', '.join(STORES)}")
    return rigs
