"""One volume, several stores (docs/multi-store.md), end to end: a real OpenBao and moto in one
mount through the provider's socket, and a class of four stores with the Google and Azure wire
fakes beside them."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml

from backends.aws.options import Options as AwsOptions
from backends.azure.options import Options as AzureOptions
from backends.gcp.options import Options as GcpOptions
from backends.vault.options import Options as VaultOptions
from devkit.azure import FakeAzure, server_tls
from devkit.azure import start as start_azure
from devkit.google import POOL, FakeGoogle, start_http, start_secret_manager
from devkit.moto import CountingProxy, MotoServer
from devkit.openbao import OpenBao, read_policy
from devkit.proxy import FaultProxy
from devkit.serving import serving
from devkit.testing import driver_request
from devkit.tokens import SigningKey
from provider.core.settings import CoreSettings

NS = "default"
ROLE_ARN = "arn:aws:iam::123456789012:role/app"
STS = "sts.amazonaws.com"


def stores(**extra: dict[str, str]) -> str:
    return yaml.safe_dump(
        {
            "vault": {"backend": "vault", "roleName": "app", "vaultAuthMountPath": "jwt"},
            "aws": {"backend": "aws", "region": "us-east-1", "roleArn": ROLE_ARN},
            **extra,
        }
    )


OBJECTS = [
    {
        "store": "vault",
        "objectName": "db-password",
        "secretPath": "secret/data/db",
        "secretKey": "password",
        "filePermission": 0o400,
    },
    {
        "store": "aws",
        "objectName": "prod/api-key",
        "objectType": "secretsmanager",
        "objectAlias": "api-key",
    },
]
TEMPLATES = yaml.safe_dump(
    [
        {"path": "app.env", "format": "env", "objects": ["db-password", "api-key"]},
        {"path": "url", "mode": 0o440, "template": "https://app:${db-password}@${api-key}\n"},
    ]
)


@dataclass
class Rig:
    bao: OpenBao
    vault_proxy: FaultProxy
    moto: MotoServer
    aws: CountingProxy
    keys: SigningKey
    stub: Any
    health: str

    def params(self, objects: list[dict[str, Any]] = OBJECTS, **extra: str) -> dict[str, str]:
        return {
            "stores": stores(),
            "objects": yaml.safe_dump(objects),
            "templates": TEMPLATES,
            **extra,
        }

    def request(
        self,
        params: dict[str, str] | None = None,
        sa: str = "app",
        audiences: tuple[str, ...] = ("vault", STS),
        pod: str = "web-0",
    ) -> Any:
        tokens = {aud: self.keys.pod_token(NS, sa, aud) for aud in audiences}
        return driver_request(
            params or self.params(),
            tokens=tokens,
            namespace=NS,
            service_account=sa,
            pod=pod,
            spc="multi",
        )

    def vault_reads(self, path: str = "secret/data/db") -> int:
        return self.bao.audit_counts()[("read", path)]

    async def metric(self, pattern: str) -> float:
        async with aiohttp.ClientSession() as http, http.get(f"{self.health}/metrics") as resp:
            text = await resp.text()
        match = re.search(re.escape(pattern) + r" ([0-9.e+]+)", text)
        return float(match.group(1)) if match else 0.0


@pytest.fixture
async def rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    core = dict(getattr(request, "param", {}) or {})
    bao = OpenBao.start(tmp_path / "openbao")
    keys = SigningKey.generate()
    bao.configure_jwt_auth("jwt", keys.public_pem)
    bao.put_policy("app", read_policy(["secret/data/*"]))
    bao.add_jwt_role("jwt", "app", namespace=NS, service_account="app", policies=["app"])
    bao.kv2_put("secret", "db", {"username": "app", "password": "correct-horse"})
    bao.kv2_put("secret", "legacy-key", {"key": "from-vault"})
    bao.audit_mark()
    moto = MotoServer.start()
    moto.client("secretsmanager").create_secret(Name="prod/api-key", SecretString="api.example")
    vault_proxy, aws = FaultProxy(bao.addr), CountingProxy(moto.url)
    await vault_proxy.start()
    await aws.start()
    options = {
        "vault": VaultOptions(addr=vault_proxy.url),
        "aws": AwsOptions(
            region="us-east-1", endpoints=f"us-east-1={aws.url}", sts_endpoint=aws.url
        ),
    }
    try:
        async with serving(tmp_path, backend_options=options, core=CoreSettings(**core)) as run:
            yield Rig(bao, vault_proxy, moto, aws, keys, run.stub, run.health)
    finally:
        await aws.stop()
        await vault_proxy.stop()
        moto.stop()
        bao.stop()


def files(reply: Any) -> dict[str, tuple[int, bytes]]:
    return {f.path: (f.mode, f.contents) for f in reply.files}


async def test_one_mount_reads_openbao_and_moto_into_files_and_a_template(rig: Rig) -> None:
    reply = await rig.stub.Mount(rig.request(), timeout=20)
    assert files(reply) == {
        "db-password": (0o400, b"correct-horse"),
        "api-key": (0o644, b"api.example"),
        # A template gets the strictest mode of its inputs unless it names one.
        "app.env": (0o400, b"DB_PASSWORD='correct-horse'\nAPI_KEY='api.example'\n"),
        "url": (0o440, b"https://app:correct-horse@api.example\n"),
    }
    versions = {v.id: v.version for v in reply.object_version}
    assert set(versions) == {"db-password", "api-key", "app.env", "url"}
    # Unchanged stores, unchanged versions; a rotation in one store changes its files only.
    again = {
        v.id: v.version for v in (await rig.stub.Mount(rig.request(), timeout=20)).object_version
    }
    assert again == versions
    rig.moto.client("secretsmanager").put_secret_value(
        SecretId="prod/api-key", SecretString="api2.example"
    )
    rotated = await rig.stub.Mount(rig.request(), timeout=20)
    changed = {v.id for v in rotated.object_version if versions[v.id] != v.version}
    assert changed == {"api-key", "app.env", "url"}
    assert rig.aws.counts["AssumeRoleWithWebIdentity"] == 1  # credentials cached per identity


async def test_stores_are_read_concurrently_within_one_deadline(rig: Rig) -> None:
    # Two round trips per store (login, read), each a second late: ~2 s if concurrent, ~4 s
    # one store after the other.
    rig.vault_proxy.delay = rig.aws.delay = 1.0
    start = time.monotonic()
    reply = await rig.stub.Mount(rig.request(), timeout=20)
    elapsed = time.monotonic() - start
    assert len(reply.files) == 4
    assert 1.9 < elapsed < 3.5, elapsed  # the sum would be over 4 s


async def test_one_store_denying_fails_the_whole_mount(rig: Rig) -> None:
    rig.aws.deny.add("prod/api-key")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await rig.stub.Mount(rig.request(), timeout=20)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    details = info.value.details() or ""
    assert details.startswith("object 'api-key': in store 'aws': ")
    # The Vault object was read, yet no file is answered: all or nothing.
    assert rig.vault_reads() == 1


async def test_every_failing_object_is_named_with_its_store(rig: Rig) -> None:
    objects = [
        {**OBJECTS[0], "secretPath": "secret/data/nope"},
        {**OBJECTS[1], "objectName": "prod/missing"},
    ]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await rig.stub.Mount(rig.request(rig.params(objects)), timeout=20)
    details = info.value.details() or ""
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert details.startswith("2 objects failed: ")
    assert "object 'db-password': in store 'vault': " in details
    assert "object 'api-key': in store 'aws': " in details


async def test_a_missing_token_names_every_audience_the_class_needs(rig: Rig) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await rig.stub.Mount(rig.request(audiences=("vault",)), timeout=20)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = info.value.details() or ""
    assert details.startswith("store 'aws': no service account token for audience")
    assert "needs pod tokens for the audiences: " in details
    assert "'vault' (store 'vault')" in details
    assert f"'{STS}' (store 'aws')" in details
    # Refused before any store was asked.
    assert rig.vault_reads() == 0 and rig.aws.counts["GetSecretValue"] == 0


@pytest.mark.parametrize("rig", [{"cache_ttl": 30}], indirect=True)
async def test_caches_stay_per_store_and_identity(rig: Rig) -> None:
    two_vaults = stores(
        direct={
            "backend": "vault",
            "roleName": "app",
            "vaultAuthMountPath": "jwt",
            "vaultAddress": rig.bao.addr,
        }
    )
    objects = [*OBJECTS, {**OBJECTS[0], "store": "direct", "objectName": "db-again"}]
    params = {**rig.params(objects), "stores": two_vaults}
    first = files(await rig.stub.Mount(rig.request(params), timeout=20))
    assert first["db-again"] == first["db-password"]
    # Two stores of one backend: the same path is two identities, two logins, two reads.
    assert rig.vault_reads() == 2
    assert rig.bao.audit_counts()[("update", "auth/jwt/login")] == 2
    await rig.stub.Mount(rig.request(params, pod="web-1"), timeout=20)
    assert rig.vault_reads() == 2 and rig.aws.counts["GetSecretValue"] == 1
    # Another service account shares no cache entry: the store refuses it (not bound to the
    # role), although the values are cached for `app`.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await rig.stub.Mount(rig.request(params, sa="intruder", pod="x-0"), timeout=20)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "in store 'vault'" in (info.value.details() or "")


async def test_fallback_is_read_when_the_store_has_not_the_object(rig: Rig) -> None:
    moved = {
        "store": "aws",
        "objectName": "prod/legacy-key",
        "objectType": "secretsmanager",
        "objectAlias": "legacy",
        "fallback": {
            "store": "vault",
            "objectName": "legacy",
            "secretPath": "secret/data/legacy-key",
            "secretKey": "key",
        },
    }
    params = rig.params([*OBJECTS, moved])
    reply = await rig.stub.Mount(rig.request(params), timeout=20)
    assert files(reply)["legacy"] == (0o644, b"from-vault")
    counted = 'secrets_bridge_fallback_reads_total{backend="aws",outcome="ok"}'
    assert await rig.metric(counted) == 1.0
    # Once the secret exists in the new store, the old one is no longer asked.
    rig.moto.client("secretsmanager").create_secret(Name="prod/legacy-key", SecretString="from-aws")
    reply = await rig.stub.Mount(rig.request(params), timeout=20)
    assert files(reply)["legacy"] == (0o644, b"from-aws")
    assert rig.vault_reads("secret/data/legacy-key") == 1
    assert await rig.metric(counted) == 1.0


async def test_no_fallback_when_the_store_is_down(rig: Rig) -> None:
    moved = {
        **OBJECTS[1],
        "fallback": {
            "store": "vault",
            "objectName": "api-key",
            "secretPath": "secret/data/legacy-key",
            "secretKey": "key",
        },
    }
    rig.aws.unavailable = True
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await rig.stub.Mount(rig.request(rig.params([OBJECTS[0], moved])), timeout=6)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "in store 'aws'" in (info.value.details() or "")
    assert rig.vault_reads("secret/data/legacy-key") == 0


# -- four stores: OpenBao, moto, the Google and Azure wire fakes ---------------------------------

TENANT = "11111111-2222-3333-4444-555555555555"
CLIENT = "aaaaaaaa-0000-0000-0000-000000000001"
AZURE_AUDIENCE = "api://AzureADTokenExchange"
STS_AUDIENCE = (
    f"identitynamespace:{POOL}:https://container.googleapis.com/v1/projects/proj"
    "/locations/europe-west1/clusters/c1"
)


async def test_four_stores_in_one_class(rig: Rig, tmp_path: Path) -> None:
    google = FakeGoogle(sts_audience=STS_AUDIENCE)
    gsm, gsm_port = await start_secret_manager(google, "global", regional=False)
    http_runner, http = await start_http(google)
    google.pod_tokens["gcp-token"] = f"{NS}/app"
    google.annotations[f"{NS}/app"] = {}
    google.add_version("projects/proj/secrets/tls-ca", "CA-PEM", f"ksa:{NS}/app")
    tls = server_tls(tmp_path / "azure-tls")
    azure = FakeAzure()
    azure.federated[(TENANT, CLIENT)] = {"azure-token"}
    kv = azure.vault("payments-kv", TENANT)
    kv.access[CLIENT] = "*"
    kv.add("secret", "signing-key", {"value": "azure-signing"})
    azure_runner, azure_port = await start_azure(azure, tls.context())
    options = {
        "vault": VaultOptions(addr=rig.bao.addr),
        "aws": AwsOptions(
            region="us-east-1", endpoints=f"us-east-1={rig.aws.url}", sts_endpoint=rig.aws.url
        ),
        "gcp": GcpOptions(
            project="proj",
            location="europe-west1",
            cluster="c1",
            sts_endpoint=f"{http}/v1/token",
            iam_endpoint=http,
            secretmanager_endpoint=f"127.0.0.1:{gsm_port}",
            local_channel=True,
        ),
        "azure": AzureOptions(ca_file=str(tls.ca_file), connect_to=f"127.0.0.1:{azure_port}"),
    }
    params = {
        "stores": stores(
            gsm={"backend": "gcp"},
            kv={
                "backend": "azure",
                "keyvaultName": "payments-kv",
                "tenantID": TENANT,
                "clientID": CLIENT,
            },
        ),
        "objects": yaml.safe_dump(
            [
                *OBJECTS,
                # GCP: one `secrets:` entry; Azure: the map an `array:` string holds.
                {
                    "store": "gsm",
                    "resourceName": "projects/proj/secrets/tls-ca/versions/latest",
                    "path": "ca.pem",
                    "mode": 0o444,
                },
                {
                    "store": "kv",
                    "objectName": "signing-key",
                    "objectType": "secret",
                    "objectAlias": "signing.key",
                    "filePermission": "0400",
                },
            ]
        ),
        "templates": yaml.safe_dump(
            [{"path": "app.json", "format": "json", "objects": ["api-key", "signing.key"]}]
        ),
    }
    tokens = {
        "vault": rig.keys.pod_token(NS, "app", "vault"),
        STS: rig.keys.pod_token(NS, "app", STS),
        POOL: "gcp-token",
        AZURE_AUDIENCE: "azure-token",
    }
    request = driver_request(params, tokens=tokens, namespace=NS, service_account="app")
    (tmp_path / "four").mkdir()
    try:
        async with serving(
            tmp_path / "four", backend_options=options, core=CoreSettings(kube_api_url=http)
        ) as run:
            reply = await run.stub.Mount(request, timeout=20)
    finally:
        await azure_runner.cleanup()
        await http_runner.cleanup()
        await gsm.stop(None)
    got = files(reply)
    mode, rendered = got.pop("app.json")
    assert (mode, json.loads(rendered)) == (
        0o400,
        {"api-key": "api.example", "signing.key": "azure-signing"},
    )
    assert got == {
        "db-password": (0o400, b"correct-horse"),
        "api-key": (0o644, b"api.example"),
        "ca.pem": (0o444, b"CA-PEM"),
        "signing.key": (0o400, b"azure-signing"),
    }
    # Each store's upstream ObjectVersion ids.
    assert {v.id for v in reply.object_version} == {
        "db-password",
        "api-key",
        "projects/proj/secrets/tls-ca/versions/latest",
        "secret/signing-key",
        "app.json",
    }
