"""Refusals name the pod as namespace/name with its service account (issue 41, item 15), where
they used to call namespace/serviceaccount "the pod"; what a trust policy or an association must
allow still names the service account."""

from __future__ import annotations

import pytest

from backends.vault.awslogin import AwsSigner
from backends.vault.methods import AwsAuth
from devkit.moto import CountingProxy, MotoServer
from devkit.testing import make_env, make_pod
from provider.core.errors import MissingCredential, PermissionDenied
from tests.backends.aws.conftest import ROLE, Harness, irsa_pod

SECRET = {"objects": "- {objectName: s, objectType: secretsmanager}", "roleArn": ROLE}
POD = "pod default/web-7 (service account app)"


async def test_a_refused_web_identity_names_the_pod_and_its_service_account(
    harness: Harness, moto: MotoServer, proxy: CountingProxy
) -> None:
    proxy.deny_operations.add("AssumeRoleWithWebIdentity")
    with pytest.raises(PermissionDenied) as caught:
        await harness.mount(SECRET, irsa_pod(name="web-7"))
    text = str(caught.value)
    assert f"AssumeRoleWithWebIdentity for {ROLE} in us-east-1 ({POD})" in text
    assert "trust policy must allow default/app (sub system:serviceaccount:default:app" in text


async def test_a_missing_token_names_the_pod_and_its_service_account(harness: Harness) -> None:
    with pytest.raises(MissingCredential) as caught:
        await harness.mount(SECRET, make_pod(name="web-7", tokens={}))
    assert f"was passed for {POD} (audiences passed: none)" in str(caught.value)


async def test_vaults_aws_login_refused_by_sts_names_the_pod(
    moto: MotoServer, proxy: CountingProxy
) -> None:
    proxy.deny_operations.add("AssumeRoleWithWebIdentity")
    env = make_env("vault", aws_sts_endpoint=proxy.url)
    signer, aws = AwsSigner(env), AwsAuth(role_arn=ROLE)
    try:
        pod = irsa_pod(name="web-7")
        who = await signer.who(aws, "sts.amazonaws.com", pod)
        with pytest.raises(PermissionDenied) as caught:
            await signer.login_data(aws, who, pod.subject)
    finally:
        await env.kube.close()
    assert f"AssumeRoleWithWebIdentity for {ROLE} in us-east-1 ({POD})" in str(caught.value)


def test_a_request_without_a_pod_name_says_so() -> None:
    from provider.core.identity import pod_named

    assert pod_named(make_pod(name="")) == "default/<none> (service account app)"
