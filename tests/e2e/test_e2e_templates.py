"""The same templates against two real stores: OpenBao (Vault dialect) and moto (AWS dialect)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import pytest
import yaml

from backends.aws.options import Options as AwsOptions
from devkit.moto import CountingProxy, MotoServer
from devkit.testing import Harness, make_pod
from devkit.tokens import SigningKey
from provider.mount.mounting import MountInput
from tests.e2e.conftest import Stack

TEMPLATES = yaml.safe_dump(
    [
        {"path": "app.env", "format": "env", "objects": ["db/user", "db/password"]},
        {
            "path": "pgpass",
            "mode": 0o400,
            "template": "${db/host}:5432:*:${db/user}:${db/password}\n",
        },
    ]
)
DB = {"user": "app", "password": 'it\'s $ecret "quoted"', "host": "db.internal"}


def check_files(files: dict[str, bytes], tmp_path: Path) -> None:
    assert files["pgpass"] == f"db.internal:5432:*:app:{DB['password']}\n".encode()
    env = tmp_path / "app.env"
    env.write_bytes(files["app.env"])
    out = subprocess.run(
        ["bash", "-c", f'set -a; . "{env}"; printf "%s\\n" "$DB_USER" "$DB_PASSWORD"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines() == ["app", DB["password"]]
    assert "db" not in files  # file: false


async def test_vault_secret_to_env_and_pgpass(stack: Stack, tmp_path: Path) -> None:
    stack.bao.kv2_put("secret", "e2e/db", DB)
    request = stack.request()
    attrs = json.loads(request.attributes)
    attrs["objects"] = yaml.safe_dump(
        [{"objectName": "db", "secretPath": "secret/data/e2e/db", "explode": True, "file": False}]
    )
    attrs["templates"] = TEMPLATES
    request.attributes = json.dumps(attrs)
    reply = await stack.stub.Mount(request, timeout=10)
    files = {f.path: f.contents for f in reply.files}
    assert {f.path: f.mode for f in reply.files} == {"app.env": 0o644, "pgpass": 0o400}
    check_files(files, tmp_path)


async def test_unknown_placeholder_error_a_user_sees(stack: Stack) -> None:
    request = stack.request()
    attrs = json.loads(request.attributes)
    attrs["templates"] = yaml.safe_dump([{"path": "pgpass", "template": "${db/passwrd}"}])
    request.attributes = json.dumps(attrs)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.stub.Mount(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "templates[0].template ('pgpass'): unknown object 'db/passwrd'; known objects: o0, o1, o2"
    )


async def test_aws_secret_to_env_and_pgpass(tmp_path: Path) -> None:
    moto = MotoServer.start()
    proxy = CountingProxy(moto.url)
    await proxy.start()
    try:
        moto.client("secretsmanager").create_secret(Name="prod/db", SecretString=json.dumps(DB))
        opts = AwsOptions(
            region="us-east-1", endpoints=f"us-east-1={proxy.url}", sts_endpoint=proxy.url
        )
        h = Harness(tmp_path, options={"aws": opts})
        token = SigningKey.generate().pod_token("default", "app", "sts.amazonaws.com")
        params = {
            "backend": "aws",
            "region": "us-east-1",
            "roleArn": "arn:aws:iam::123456789012:role/app",
            "templates": TEMPLATES,
            "objects": yaml.safe_dump(
                [
                    {
                        "objectName": "prod/db",
                        "objectAlias": "db",
                        "objectType": "secretsmanager",
                        "explode": True,
                        "file": False,
                    }
                ]
            ),
        }
        result = await h.mounter.mount(
            MountInput(
                params=params, pod=make_pod(tokens={"sts.amazonaws.com": token}), permission=0o644
            )
        )
        check_files({f.path: f.contents for f in result.files}, tmp_path)
        assert proxy.counts["GetSecretValue"] == 1
        await h.backends.close()
    finally:
        await proxy.stop()
        moto.stop()
