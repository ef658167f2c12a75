"""Reads against a real moto_server: Secrets Manager, SSM, batching, errors, revalidation."""

from __future__ import annotations

import json

import jmespath

from devkit.moto import CountingProxy, MotoServer
from provider.core.errors import NotFound, PermissionDenied
from tests.backends.aws.conftest import REGION, ROLE, Harness, MakeHarness, irsa_pod


def sm_params(objects: str, **extra: str) -> dict[str, str]:
    return {"region": REGION, "roleArn": ROLE, "objects": objects, **extra}


async def test_aws_secret_string_and_binary(harness: Harness, moto: MotoServer) -> None:
    sm = moto.client("secretsmanager")
    created = sm.create_secret(Name="app/db", SecretString='{"user": "app"}')
    sm.create_secret(Name="blob", SecretBinary=b"\x00\xffbinary")
    mounted = await harness.mount(
        sm_params(
            """
            - objectName: app/db
              objectType: secretsmanager
            - objectName: blob
              objectType: secretsmanager
              objectAlias: blob.bin
            """
        )
    )
    assert mounted.content("app_db") == b'{"user": "app"}'
    assert mounted.content("blob.bin") == b"\x00\xffbinary"
    db = mounted.by_name["app_db"]
    assert not isinstance(db, BaseException)
    assert db[0].version == created["VersionId"]


async def test_aws_secret_version_id_and_label(harness: Harness, moto: MotoServer) -> None:
    sm = moto.client("secretsmanager")
    first = sm.create_secret(Name="rotating", SecretString="v1")["VersionId"]
    second = sm.put_secret_value(SecretId="rotating", SecretString="v2")["VersionId"]
    mounted = await harness.mount(
        sm_params(
            f"""
            - {{objectName: rotating, objectType: secretsmanager, objectAlias: current}}
            - {{objectName: rotating, objectType: secretsmanager, objectAlias: by-id,
                objectVersion: {first}}}
            - {{objectName: rotating, objectType: secretsmanager, objectAlias: previous,
                objectVersionLabel: AWSPREVIOUS}}
            """
        )
    )
    assert mounted.content("current") == b"v2"
    assert mounted.content("by-id") == b"v1"
    assert mounted.content("previous") == b"v1"
    current = mounted.by_name["current"]
    assert not isinstance(current, BaseException) and current[0].version == second


async def test_aws_jmespath_files_share_one_read(
    harness: Harness, moto: MotoServer, proxy: CountingProxy
) -> None:
    secret = {"db-password": "s3cret", "user": "app", "nested": {"host": "db.local"}}
    moto.client("secretsmanager").create_secret(Name="creds", SecretString=json.dumps(secret))
    mounted = await harness.mount(
        sm_params(
            """
            - objectName: creds
              objectType: secretsmanager
              jmesPath:
                - {path: '"db-password"', objectAlias: password, filePermission: "0400"}
                - {path: user, objectAlias: username}
                - {path: nested.host, objectAlias: host}
            """
        )
    )
    specs = {spec.name: spec for spec in mounted.plan.objects}
    assert set(specs) == {"creds", "password", "username", "host"}
    assert len({spec.ref for spec in specs.values()}) == 1
    assert proxy.counts["GetSecretValue"] == 1
    assert specs["password"].mode == 0o400
    raw = json.loads(mounted.content("creds"))
    extracted = {
        name: jmespath.search(spec.transforms.extract, raw)
        for name, spec in specs.items()
        if spec.transforms.extract
    }
    assert extracted == {"password": "s3cret", "username": "app", "host": "db.local"}
    assert all(specs[n].transforms.parse_as == "json" for n in extracted)


async def test_aws_ssm_securestring_stringlist_versions(harness: Harness, moto: MotoServer) -> None:
    ssm = moto.client("ssm")
    ssm.put_parameter(Name="/app/token", Value="t1", Type="SecureString")
    ssm.put_parameter(Name="/app/token", Value="t2", Type="SecureString", Overwrite=True)
    ssm.label_parameter_version(Name="/app/token", ParameterVersion=1, Labels=["old"])
    ssm.put_parameter(Name="/app/hosts", Value="a,b,c", Type="StringList")
    mounted = await harness.mount(
        sm_params(
            """
            - {objectName: /app/token, objectType: ssmparameter}
            - {objectName: /app/token, objectType: ssmparameter, objectAlias: v1,
               objectVersion: "1"}
            - {objectName: /app/token, objectType: ssmparameter, objectAlias: old,
               objectVersionLabel: old}
            - {objectName: /app/hosts, objectType: ssmparameter, objectAlias: hosts}
            """
        )
    )
    assert mounted.content("_app_token") == b"t2"
    assert mounted.content("v1") == b"t1"
    assert mounted.content("old") == b"t1"
    assert mounted.content("hosts") == b"a,b,c"
    latest = mounted.by_name["_app_token"]
    assert not isinstance(latest, BaseException) and latest[0].version == "2"


async def test_aws_ssm_batches_ten_names_per_call(
    harness: Harness, moto: MotoServer, proxy: CountingProxy
) -> None:
    ssm = moto.client("ssm")
    lines = []
    for i in range(25):
        ssm.put_parameter(Name=f"p{i}", Value=f"value-{i}", Type="SecureString")
        lines.append(f"- {{objectName: p{i}, objectType: ssmparameter}}")
    mounted = await harness.mount(sm_params("\n".join(lines)))
    assert proxy.counts["GetParameters"] == 3
    assert sorted(len(body["Names"]) for body in proxy.bodies["GetParameters"]) == [5, 10, 10]
    assert all(body["WithDecryption"] for body in proxy.bodies["GetParameters"])
    assert all(mounted.content(f"p{i}") == f"value-{i}".encode() for i in range(25))


async def test_aws_missing_objects_name_object_and_region(
    harness: Harness, moto: MotoServer
) -> None:
    moto.client("ssm").put_parameter(Name="there", Value="x", Type="String")
    mounted = await harness.mount(
        sm_params(
            """
            - {objectName: nosuch-secret, objectType: secretsmanager}
            - {objectName: nosuch-param, objectType: ssmparameter}
            - {objectName: there, objectType: ssmparameter}
            """
        )
    )
    assert mounted.content("there") == b"x"
    for name in ("nosuch-secret", "nosuch-param"):
        error = mounted.error(name)
        assert isinstance(error, NotFound)
        assert name in str(error) and REGION in str(error)
        assert "default/app" in str(error)


async def test_aws_denied_objects_name_object_region_and_role(
    harness: Harness, moto: MotoServer, proxy: CountingProxy
) -> None:
    moto.client("secretsmanager").create_secret(Name="forbidden-secret", SecretString="x")
    ssm = moto.client("ssm")
    for name in ("forbidden-param", "allowed-param"):
        ssm.put_parameter(Name=name, Value=name, Type="String")
    proxy.deny.add("forbidden")
    mounted = await harness.mount(
        sm_params(
            """
            - {objectName: forbidden-secret, objectType: secretsmanager}
            - {objectName: forbidden-param, objectType: ssmparameter}
            - {objectName: allowed-param, objectType: ssmparameter}
            """
        )
    )
    # The batch was refused as a whole; asking one by one tells which name is denied.
    assert mounted.content("allowed-param") == b"allowed-param"
    for name in ("forbidden-secret", "forbidden-param"):
        error = mounted.error(name)
        assert isinstance(error, PermissionDenied)
        text = str(error)
        assert name in text and REGION in text and ROLE in text and "default/app" in text
        assert "allow" in text


async def test_aws_repeat_fetch_is_one_describe_secret(
    harness: Harness, moto: MotoServer, proxy: CountingProxy
) -> None:
    sm = moto.client("secretsmanager")
    sm.create_secret(Name="cheap", SecretString="v1")
    parameters = sm_params("- {objectName: cheap, objectType: secretsmanager}")
    first = await harness.mount(parameters)
    second = await harness.mount(parameters)
    assert first.content("cheap") == second.content("cheap") == b"v1"
    assert proxy.counts["GetSecretValue"] == 1
    assert proxy.counts["DescribeSecret"] == 1

    sm.put_secret_value(SecretId="cheap", SecretString="v2")
    third = await harness.mount(parameters)
    assert third.content("cheap") == b"v2"
    assert proxy.counts["GetSecretValue"] == 2
    assert proxy.counts["DescribeSecret"] == 2


async def test_aws_revalidation_off_and_denied_describe_read(
    make_harness: MakeHarness, moto: MotoServer, proxy: CountingProxy
) -> None:
    moto.client("secretsmanager").create_secret(Name="plain", SecretString="v1")
    parameters = sm_params("- {objectName: plain, objectType: secretsmanager}")
    off = make_harness(f"{REGION}={proxy.url}", revalidate_max_age=0)
    await off.mount(parameters)
    await off.mount(parameters)
    assert proxy.counts["GetSecretValue"] == 2
    assert proxy.counts["DescribeSecret"] == 0

    on = make_harness(f"{REGION}={proxy.url}")
    await on.mount(parameters)
    proxy.deny_operations.add("DescribeSecret")
    mounted = await on.mount(parameters)
    assert mounted.content("plain") == b"v1"
    assert proxy.counts["DescribeSecret"] == 1
    assert proxy.counts["GetSecretValue"] == 4
    # Denied once: later mounts read without asking DescribeSecret first.
    await on.mount(parameters)
    assert proxy.counts["DescribeSecret"] == 1
    assert proxy.counts["GetSecretValue"] == 5


async def test_aws_revalidation_is_per_identity(
    make_harness: MakeHarness, moto: MotoServer, proxy: CountingProxy
) -> None:
    moto.client("secretsmanager").create_secret(Name="shared", SecretString="v1")
    parameters = sm_params("- {objectName: shared, objectType: secretsmanager}")
    h = make_harness(f"{REGION}={proxy.url}")
    await h.mount(parameters, irsa_pod(sa="one"))
    await h.mount(parameters, irsa_pod(sa="two"))
    assert proxy.counts["GetSecretValue"] == 2
    assert proxy.counts["DescribeSecret"] == 0
    await h.mount(parameters, irsa_pod(sa="one"))
    assert proxy.counts["DescribeSecret"] == 1
