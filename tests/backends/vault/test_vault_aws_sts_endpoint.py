"""`--aws-sts-endpoint` is the one STS endpoint of every STS call the provider makes (issue 41,
item 14): Vault's aws login (vaultAuthType: aws) assumes the pod's IRSA role there too, not only
the aws store. moto's STS at a loopback port stands for a private STS endpoint; nothing else
names it (no AWS_ENDPOINT_URL_STS), so without the setting the login goes to
sts.<region>.amazonaws.com and fails."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest

from backends.vault.options import Options
from backends.vault.store import create
from devkit.moto import MotoServer, moto_server
from devkit.openbao import OpenBao
from devkit.testing import fetch_ctx, make_pod
from devkit.vault_aws import VaultAwsAuth
from provider.cli.main import build_parser, settings_from_args
from provider.core.backend import BackendEnv
from provider.core.caching import ExpiringCache
from provider.core.kube import KubeClient
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings
from tests.backends.vault.conftest import plan_for
from tests.backends.vault.test_vault_aws_auth import APP_ROLE, OBJECTS, POD_TOKEN, TRUST


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with moto_server() as server:
        server.client("iam").create_role(RoleName="vault-app", AssumeRolePolicyDocument=TRUST)
        yield server


@pytest.fixture
async def vault_aws(
    openbao: OpenBao, moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[VaultAwsAuth]:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_STS", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    openbao.kv2_put("secret", "app/aws-db", {"password": "s3cr3t-aws"})
    auth = VaultAwsAuth(openbao.addr, sts_endpoint=moto.url)
    auth.add_role("app", bound_iam_principal_arn=APP_ROLE, policies=["app"], iam=moto.url)
    await auth.start()
    yield auth
    await auth.stop()


async def login_and_read(core: CoreSettings, vault: VaultAwsAuth) -> str:
    env = BackendEnv(
        name="vault",
        core=core,
        options=Options(addr=vault.url),
        kube=KubeClient(None),
        metrics=Metrics(),
        credentials=ExpiringCache(),
    )
    backend = create(env)
    try:
        plan = plan_for(
            OBJECTS,
            vaultAddress=vault.url,
            roleName="app",
            vaultAuthType="aws",
            vaultAWSRoleArn=APP_ROLE,
        )
        pod = make_pod(tokens={"sts.amazonaws.com": POD_TOKEN})
        identity = await backend.identify(plan, pod)
        ref = plan.objects[0].ref
        fetched = (await backend.fetch(plan, identity, [ref], fetch_ctx(20)))[ref]
        if isinstance(fetched, BaseException):
            raise fetched
        return str(json.loads(fetched[0].content)["data"]["data"]["password"])
    finally:
        await backend.close()
        await env.kube.close()


async def test_the_flag_reaches_vaults_aws_login(vault_aws: VaultAwsAuth, moto: MotoServer) -> None:
    args = build_parser("serve").parse_args(["serve", "--aws-sts-endpoint", moto.url])
    settings = settings_from_args(args)
    # One flag, one value for both stores.
    assert settings.core.aws_sts_endpoint == moto.url
    assert settings.backend_options["aws"].sts_endpoint == moto.url
    assert await login_and_read(settings.core, vault_aws) == "s3cr3t-aws"
    assert vault_aws.logins == [APP_ROLE]  # moto's STS issued the role's credentials


async def test_the_core_setting_is_where_vaults_aws_login_calls_sts(
    vault_aws: VaultAwsAuth, moto: MotoServer
) -> None:
    core = CoreSettings(aws_sts_endpoint=moto.url)
    assert await login_and_read(core, vault_aws) == "s3cr3t-aws"
    assert vault_aws.logins == [APP_ROLE]
