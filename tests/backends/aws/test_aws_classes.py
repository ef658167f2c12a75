"""Whole classes against moto: upstream's documented class, ARNs, SDK endpoint variables, limits."""

from __future__ import annotations

import argparse
import json

import jmespath
import pytest

from backends.aws.options import Options
from devkit.moto import CountingProxy, MotoServer
from provider.core.settings import add_options_flags, options_from_args
from tests.backends.aws.conftest import REGION, ROLE, Harness, MakeHarness

# The AWS provider's README class, with `provider: aws` -> `secrets-bridge` and `backend: aws`
# added (the core strips `backend`); no region: the provider's --aws-region supplies it.
DOCUMENTED = {
    "backend": "aws",
    "roleArn": ROLE,
    "objects": """
        - objectName: "MySecret"
          objectType: "secretsmanager"
          jmesPath:
              - path: "username"
                objectAlias: "MySecretUsername"
              - path: "password"
                objectAlias: "MySecretPassword"
        - objectName: "MyParameter"
          objectType: "ssmparameter"
    """,
}


async def test_aws_documented_class_mounts(
    harness: Harness, moto: MotoServer, proxy: CountingProxy
) -> None:
    moto.client("secretsmanager").create_secret(
        Name="MySecret", SecretString=json.dumps({"username": "testuser", "password": "pw"})
    )
    moto.client("ssm").put_parameter(Name="MyParameter", Value="param", Type="SecureString")
    mounted = await harness.mount(DOCUMENTED)
    files = {}
    for spec in mounted.plan.objects:
        content = mounted.content(spec.name)
        if spec.transforms.extract:
            content = jmespath.search(spec.transforms.extract, json.loads(content)).encode()
        files[spec.name] = content
    assert files == {
        "MySecret": b'{"username": "testuser", "password": "pw"}',
        "MySecretUsername": b"testuser",
        "MySecretPassword": b"pw",
        "MyParameter": b"param",
    }
    assert proxy.counts["GetSecretValue"] == 1 and proxy.counts["GetParameters"] == 1


async def test_aws_arn_without_object_type(
    make_harness: MakeHarness, moto: MotoServer, proxy: CountingProxy
) -> None:
    arn = moto.client("secretsmanager").create_secret(Name="by-arn", SecretString="x")["ARN"]
    h = make_harness(f"{REGION}={proxy.url}")
    mounted = await h.mount(
        {"roleArn": ROLE, "objects": f"- {{objectName: '{arn}', objectAlias: by-arn}}"}
    )
    assert mounted.content("by-arn") == b"x"


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SECRETS_MANAGER"])
async def test_aws_standard_sdk_endpoint_variables(
    make_harness: MakeHarness,
    moto: MotoServer,
    proxy: CountingProxy,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
) -> None:
    moto.client("secretsmanager").create_secret(Name="via-env", SecretString="env")
    monkeypatch.setenv(variable, proxy.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", proxy.url)
    h = make_harness()  # no --aws-endpoints: botocore's own variables decide
    mounted = await h.mount(
        {"roleArn": ROLE, "objects": "- {objectName: via-env, objectType: secretsmanager}"}
    )
    assert mounted.content("via-env") == b"env"
    assert proxy.counts["GetSecretValue"] == 1


@pytest.mark.parametrize("limit", [2, 32])
async def test_aws_concurrency_limit(
    make_harness: MakeHarness, moto: MotoServer, proxy: CountingProxy, limit: int
) -> None:
    sm = moto.client("secretsmanager")
    for i in range(12):
        sm.create_secret(Name=f"c{i}", SecretString=str(i))
    h = make_harness(f"{REGION}={proxy.url}", max_concurrency=limit, revalidate_max_age=0)
    objects = "\n".join(f"- {{objectName: c{i}, objectType: secretsmanager}}" for i in range(12))
    await h.mount({"roleArn": ROLE, "objects": objects})  # logs in, opens the client
    proxy.max_inflight = 0
    proxy.delay = 0.05
    mounted = await h.mount({"roleArn": ROLE, "objects": objects})
    assert mounted.content("c11") == b"11"
    if limit == 2:
        assert proxy.max_inflight == 2
    else:
        assert proxy.max_inflight > 2  # the reads of one mount do run concurrently


def test_aws_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    monkeypatch.setenv("SECRETS_BRIDGE_AWS_MAX_CONCURRENCY", "7")
    parser = argparse.ArgumentParser()
    add_options_flags(parser, "aws", Options)
    args = parser.parse_args(["--aws-endpoints", "eu-central-1=http://127.0.0.1:1"])
    options = options_from_args(args, "aws", Options)
    assert options == Options(
        region="eu-central-1", endpoints="eu-central-1=http://127.0.0.1:1", max_concurrency=7
    )
