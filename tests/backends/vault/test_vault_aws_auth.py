"""Vault's aws auth method (iam type), logged in to as the pod with its IRSA or Pod Identity
credentials: the signed GetCallerIdentity replayed to a real moto STS, which checks the SigV4
signature, the token a real OpenBao's (devkit/vault_aws.py says why Vault's method is a fake)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import ClientSession, web

from backends.clouds.aws import Credentials
from backends.vault.awslogin import signed_login
from backends.vault.methods import AwsAuth
from backends.vault.options import SDK_LOGGERS, Options
from backends.vault.store import VaultBackend, create
from devkit.moto import ACCOUNT, MotoServer, moto_server
from devkit.openbao import OpenBao
from devkit.ports import serve_app
from devkit.testing import fetch_ctx, make_env, make_pod
from devkit.vault_aws import VaultAwsAuth
from provider.core.errors import MissingCredential, PermissionDenied
from provider.core.model import Pod
from tests.backends.vault.conftest import plan_for

POD_TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ0ZXN0In0.c2lnbmF0dXJl"
APP_ROLE = f"arn:aws:iam::{ACCOUNT}:role/vault-app"
OTHER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/vault-other"
OBJECTS = "- {objectName: password, secretPath: secret/data/app/aws-db, secretKey: password}"
TRUST = json.dumps(
    {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Federated": f"arn:aws:iam::{ACCOUNT}:oidc-provider/eks"},
                "Action": "sts:AssumeRoleWithWebIdentity",
            }
        ],
    }
)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with moto_server() as server:
        iam = server.client("iam")
        for arn in (APP_ROLE, OTHER_ROLE):
            iam.create_role(RoleName=arn.rpartition("/")[2], AssumeRolePolicyDocument=TRUST)
        yield server


@pytest.fixture(scope="module")
def secret(openbao: OpenBao) -> str:
    openbao.kv2_put("secret", "app/aws-db", {"password": "s3cr3t-aws"})
    return "s3cr3t-aws"


@pytest.fixture
async def vault_aws(
    openbao: OpenBao, moto: MotoServer, secret: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[VaultAwsAuth]:
    # Where the provider calls AssumeRoleWithWebIdentity (botocore reads it, as in a pod).
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", moto.url)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    auth = VaultAwsAuth(openbao.addr, sts_endpoint=moto.url)
    auth.add_role("app", bound_iam_principal_arn=APP_ROLE, policies=["app"], iam=moto.url)
    await auth.start()
    yield auth
    await auth.stop()


@pytest.fixture
async def backend(vault_aws: VaultAwsAuth) -> AsyncIterator[VaultBackend]:
    vault = create(make_env("vault", Options(addr=vault_aws.url)))
    yield vault
    await vault.close()


def irsa_pod(**tokens: str) -> Pod:
    return make_pod(tokens=tokens or {"sts.amazonaws.com": POD_TOKEN})


async def mount(backend: VaultBackend, vault: VaultAwsAuth, pod: Pod, **params: str) -> bytes:
    plan = plan_for(OBJECTS, vaultAddress=vault.url, roleName="app", vaultAuthType="aws", **params)
    identity = await backend.identify(plan, pod)
    (fetched,) = (await backend.fetch(plan, identity, [plan.objects[0].ref], fetch_ctx())).values()
    if isinstance(fetched, BaseException):
        raise fetched
    return fetched[0].content


async def test_the_pod_logs_in_with_its_signed_request_and_reads(
    backend: VaultBackend, vault_aws: VaultAwsAuth, secret: str
) -> None:
    content = await mount(backend, vault_aws, irsa_pod(), vaultAWSRoleArn=APP_ROLE)
    assert json.loads(content)["data"]["data"]["password"] == secret
    # Vault's method replayed it to its sts_endpoint, and moto (checking the signature) said
    # who signed it: the role the pod assumed with its web identity.
    assert vault_aws.sts_calls == [("GetCallerIdentity", 200)]
    assert vault_aws.logins == [APP_ROLE]
    await mount(backend, vault_aws, irsa_pod(), vaultAWSRoleArn=APP_ROLE)
    assert len(vault_aws.logins) == 1, "the Vault token is cached per identity"


async def test_the_identity_key_names_method_role_mount_and_cloud_identity(
    backend: VaultBackend,
) -> None:
    plan = plan_for(
        OBJECTS,
        vaultAddress="http://vault",
        roleName="app",
        vaultAuthType="aws",
        vaultAWSRoleArn=APP_ROLE,
    )
    identity = await backend.identify(plan, irsa_pod())
    assert identity.key.split("|")[3:] == [
        "aws",
        "app",
        "sts.amazonaws.com",
        "aws",
        f"irsa:{APP_ROLE}",
        "us-east-1",
        "-",
        "default/app",
    ]
    other = await backend.identify(
        plan_for(
            OBJECTS,
            vaultAddress="http://vault",
            roleName="app",
            vaultAuthType="aws",
            vaultAWSRoleArn=OTHER_ROLE,
        ),
        irsa_pod(),
    )
    assert other.key != identity.key
    assert POD_TOKEN not in identity.key


async def test_a_role_bound_to_another_principal_refuses_and_says_what_to_bind(
    backend: VaultBackend, vault_aws: VaultAwsAuth, caplog: pytest.LogCaptureFixture
) -> None:
    # As `serve` runs: our loggers at DEBUG (tests/conftest.py checks every record for secret
    # material), the SDK's at WARNING (backends/vault/options.py SDK_LOGGERS).
    for sdk in SDK_LOGGERS:
        caplog.set_level(logging.WARNING, logger=sdk)
    with pytest.raises(PermissionDenied) as refused:
        await mount(backend, vault_aws, irsa_pod(), vaultAWSRoleArn=OTHER_ROLE)
    message = str(refused.value)
    assert "default/app" in message and "role 'app'" in message and "auth/aws" in message
    assert f"not bound to {OTHER_ROLE}" in message
    assert "bound_iam_principal_arn" in message
    assert vault_aws.logins == [OTHER_ROLE]
    for text in (message, caplog.text):
        assert POD_TOKEN not in text
        assert "Signature=" not in text and "X-Amz-Security-Token" not in text


async def test_a_pod_without_the_aws_audience_token_is_told_which_audience(
    backend: VaultBackend, vault_aws: VaultAwsAuth
) -> None:
    with pytest.raises(MissingCredential, match=r"'sts\.amazonaws\.com'"):
        await mount(backend, vault_aws, irsa_pod(vault="x"), vaultAWSRoleArn=APP_ROLE)
    assert vault_aws.sts_calls == []


async def test_the_server_id_header_is_signed_and_checked(
    backend: VaultBackend, vault_aws: VaultAwsAuth, secret: str
) -> None:
    vault_aws.server_id = "vault.example.com"
    with pytest.raises(PermissionDenied, match="vaultAWSIAMServerID"):
        await mount(backend, vault_aws, irsa_pod(), vaultAWSRoleArn=APP_ROLE)
    content = await mount(
        backend,
        vault_aws,
        irsa_pod(),
        vaultAWSRoleArn=APP_ROLE,
        vaultAWSIAMServerID="vault.example.com",
    )
    assert json.loads(content)["data"]["data"]["password"] == secret


async def test_moto_refuses_a_request_signed_with_the_wrong_secret(
    vault_aws: VaultAwsAuth, moto: MotoServer
) -> None:
    """The replay really reaches STS, which checks the signature botocore made."""
    sts = moto.client("sts")
    creds = sts.assume_role_with_web_identity(
        RoleArn=APP_ROLE, RoleSessionName="test", WebIdentityToken=POD_TOKEN
    )["Credentials"]
    aws = AwsAuth()
    good = Credentials(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"])
    bad = Credentials(creds["AccessKeyId"], "not-the-secret", creds["SessionToken"])
    async with ClientSession() as http:
        for creds_, status in ((bad, 400), (good, 200)):
            body = {"role": "app", **signed_login(aws, creds_)}
            async with http.post(f"{vault_aws.url}/v1/auth/aws/login", json=body) as answer:
                assert answer.status == status, await answer.text()
    assert vault_aws.sts_calls == [("GetCallerIdentity", 403), ("GetCallerIdentity", 200)]


async def test_pod_identity_credentials_come_from_the_agent_with_the_pods_token(
    backend: VaultBackend,
    vault_aws: VaultAwsAuth,
    moto: MotoServer,
    secret: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    creds = moto.client("sts").assume_role_with_web_identity(
        RoleArn=APP_ROLE, RoleSessionName="eks-pod-identity", WebIdentityToken=POD_TOKEN
    )["Credentials"]
    seen: list[str] = []

    async def agent(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response(
            {
                "AccessKeyId": creds["AccessKeyId"],
                "SecretAccessKey": creds["SecretAccessKey"],
                "Token": creds["SessionToken"],
            }
        )

    app = web.Application()
    app.router.add_get("/v1/credentials", agent)
    runner, port = await serve_app(app)
    monkeypatch.setenv(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI", f"http://127.0.0.1:{port}/v1/credentials"
    )
    try:
        pod = irsa_pod(**{"pods.eks.amazonaws.com": "pod-identity-token"})
        content = await mount(backend, vault_aws, pod, vaultAWSUsePodIdentity="true")
    finally:
        await runner.cleanup()
    assert json.loads(content)["data"]["data"]["password"] == secret
    assert seen == ["pod-identity-token"]
    assert vault_aws.logins == [APP_ROLE]
