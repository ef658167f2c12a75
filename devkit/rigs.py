"""Stores for `bench`: each rig starts (or prepares) a store, seeds it, tells the provider how
to reach it, and counts the calls the store served (on the store's side where it can).

The OpenBao rig can also be killed and started again while the provider runs (`restart`, the
soak scenario's outages): the provider reaches it through a TCP forwarder (`devkit.forward`)
that keeps one address while the server behind it is replaced, and the new dev server is seeded
again (a dev server keeps nothing), so the provider's Vault tokens die with the old one."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Protocol

import yaml

from devkit.forward import Forwarder
from devkit.moto import CountingProxy, MotoServer
from devkit.openbao import OpenBao, read_policy
from devkit.proxy import FaultProxy
from devkit.tokens import SigningKey


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

    def __init__(
        self,
        work: Path,
        objects: int,
        identities: int,
        error_rate: float,
        service_accounts: list[str] | None = None,
    ) -> None:
        self.work = work / "openbao"
        self.bao: OpenBao | None = None
        self.proxy: FaultProxy | None = None
        self.forwarder: Forwarder | None = None
        self.restarts = 0
        self._counted: dict[str, int] = {}
        self.error_rate = error_rate
        self.pod_tokens = SigningKey.generate()
        self.objects = objects
        self.accounts = service_accounts or [f"sa-{k}" for k in range(identities)]
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
        self.bao = bao = await asyncio.to_thread(OpenBao.start, self.work)
        await asyncio.to_thread(self._seed, bao)
        host, port = bao.addr.removeprefix("http://").rsplit(":", 1)
        self.forwarder = Forwarder(host, int(port))
        await self.forwarder.start()
        url = self.forwarder.url
        if self.error_rate > 0:
            self.proxy = FaultProxy(url)
            self.proxy.error_rate = self.error_rate
            await self.proxy.start()
            url = self.proxy.url
        self.provider_args = ["--vault-addr", url]

    def _seed(self, bao: OpenBao) -> None:
        bao.configure_jwt_auth("jwt", self.pod_tokens.public_pem)
        bao.put_policy("bench", read_policy(["secret/data/bench/*"]))
        bao.add_jwt_role(
            "jwt", "bench", namespace="bench", service_account=self.accounts, policies=["bench"]
        )
        for i in range(self.objects):
            bao.kv2_put("secret", f"bench/s{i}", {"user": f"u{i}", "password": f"p{i}"})
        bao.audit_mark()
        bao.root_token_hash()  # known before a restart kills the server whose log is counted

    def tokens(self, service_account: str) -> dict[str, str]:
        if service_account not in self._tokens:
            token = self.pod_tokens.pod_token("bench", service_account, "vault")
            self._tokens[service_account] = token
        return {"vault": self._tokens[service_account]}

    async def restart(self, down: float) -> None:
        """Kill the server (open connections are cut), stay down `down` seconds, start a new
        one behind the same address and seed it again."""
        assert self.bao is not None and self.forwarder is not None
        self.forwarder.upstream = None
        self.forwarder.drop()
        self.bao.process.kill()
        await asyncio.to_thread(self.bao.process.wait)
        # Counted from the dead server's audit log, in a thread: parsing a busy run's log takes
        # about a second, and the forwarder, on this event loop, would hold every request in
        # flight at the kill for that long (mounts that read as slow or pile up at each
        # outage for the bench's sake, not the provider's).
        self._counted = await asyncio.to_thread(self.store_calls)
        await asyncio.sleep(down)
        work = self.work.with_name(f"openbao-{self.restarts + 1}")
        bao = await asyncio.to_thread(OpenBao.start, work)
        await asyncio.to_thread(self._seed, bao)
        self.bao, self.restarts = bao, self.restarts + 1
        host, port = bao.addr.removeprefix("http://").rsplit(":", 1)
        self.forwarder.upstream = (host, int(port))

    def store_calls(self) -> dict[str, int]:
        counts = self.bao.audit_counts() if self.bao is not None else {}
        calls = {
            "logins": sum(n for (_, path), n in counts.items() if path.endswith("auth/jwt/login")),
            "reads": sum(n for (op, _), n in counts.items() if op == "read"),
        }
        # Servers replaced by `restart` took their audit logs with them: add what they counted.
        calls = {k: v + self._counted.get(k, 0) for k, v in calls.items()}
        if self.proxy is not None:
            calls["requests"] = self.proxy.calls
            calls["answered 429"] = self.proxy.injected
        return calls

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
        if self.forwarder is not None:
            await self.forwarder.stop()
        if self.bao is not None:
            await asyncio.to_thread(self.bao.stop)


class MotoRig:
    """moto_server behind a counting proxy: IRSA (AssumeRoleWithWebIdentity) and Secrets
    Manager reads, counted on the wire by AWS operation."""

    name = "moto"

    def __init__(self, work: Path, objects: int) -> None:
        self.work = work
        self.moto: MotoServer | None = None
        self.proxy: CountingProxy | None = None
        self.pod_tokens = SigningKey.generate()
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
        self.moto = moto = await asyncio.to_thread(MotoServer.start, self.work / "moto.log")
        await asyncio.to_thread(self._seed, moto)
        self.proxy = CountingProxy(moto.url)
        await self.proxy.start()
        self.provider_args = [
            "--aws-region",
            "us-east-1",
            "--aws-endpoints",
            f"us-east-1={self.proxy.url}",
            "--aws-sts-endpoint",
            self.proxy.url,
        ]

    def _seed(self, moto: MotoServer) -> None:
        client = moto.client("secretsmanager")
        for i in range(self.objects):
            client.create_secret(
                Name=f"bench-s{i}", SecretString=f'{{"user": "u{i}", "password": "p{i}"}}'
            )

    def tokens(self, service_account: str) -> dict[str, str]:
        if service_account not in self._tokens:
            token = self.pod_tokens.pod_token("bench", service_account, "sts.amazonaws.com")
            self._tokens[service_account] = token
        return {"sts.amazonaws.com": self._tokens[service_account]}

    def store_calls(self) -> dict[str, int]:
        return dict(self.proxy.counts) if self.proxy is not None else {}

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
        if self.moto is not None:
            await asyncio.to_thread(self.moto.stop)


STORES = ("fake", "openbao", "moto")


def make_rigs(
    stores: list[str],
    work: Path,
    *,
    objects: int,
    identities: int,
    health_port: int,
    error_rate: float = 0.0,
    service_accounts: list[str] | None = None,
) -> list[Rig]:
    rigs: list[Rig] = []
    for store in stores:
        if store == "fake":
            rigs.append(FakeRig(work, objects, health_port))
        elif store == "openbao":
            rigs.append(OpenBaoRig(work, objects, identities, error_rate, service_accounts))
        elif store == "moto":
            rigs.append(MotoRig(work, objects))
        else:
            raise SystemExit(f"bench: unknown store {store!r}; choose from {', '.join(STORES)}")
    return rigs
