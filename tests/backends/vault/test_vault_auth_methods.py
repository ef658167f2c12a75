"""vaultAuthType and the aws method's keys: defaults, audiences, and every problem named."""

from __future__ import annotations

import pytest

from backends.vault import dialect
from backends.vault.methods import AwsAuth
from backends.vault.options import Options
from provider.core.model import ParseContext
from provider.core.parsing import InvalidClass

OBJECTS = "- {objectName: a, secretPath: secret/data/a, secretKey: k}"
ROLE_ARN = "arn:aws:iam::111122223333:role/app"


def parse(**params: str) -> dialect.VaultStore:
    base = {"objects": OBJECTS, "roleName": "app", "vaultAddress": "https://vault:8200"}
    return dialect.parse({**base, **params}, ParseContext(options=Options())).store


def problems(**params: str) -> str:
    with pytest.raises(InvalidClass) as refused:
        parse(**params)
    return str(refused.value)


def test_without_an_auth_type_the_login_is_kubernetes_as_before() -> None:
    store = parse()
    assert (store.method, store.mount, store.audience, store.aws) == (
        "kubernetes",
        "kubernetes",
        "vault",
        None,
    )
    assert dialect.audiences(store) == ("vault",)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"vaultAuthType": "jwt"}, ("jwt", "jwt", "vault")),
        ({"vaultAuthType": "aws"}, ("aws", "aws", "sts.amazonaws.com")),
        ({"baoAuthType": "AWS"}, ("aws", "aws", "sts.amazonaws.com")),
        (
            {"vaultAuthType": "aws", "vaultAWSUsePodIdentity": "true"},
            ("aws", "aws", "pods.eks.amazonaws.com"),
        ),
        (
            {"vaultAuthType": "aws", "vaultAuthMountPath": "eks/prod", "audience": "sts-custom"},
            ("aws", "eks/prod", "sts-custom"),
        ),
    ],
)
def test_method_mount_and_audience(params: dict[str, str], expected: tuple[str, ...]) -> None:
    store = parse(**params)
    assert (store.method, store.mount, store.audience) == expected
    assert dialect.audiences(store) == (expected[2],)


def test_the_aws_settings() -> None:
    store = parse(
        vaultAuthType="aws",
        vaultAWSRegion="eu-west-1",
        vaultAWSRoleArn=ROLE_ARN,
        vaultAWSIAMServerID="vault.example.com",
    )
    assert store.aws == AwsAuth("eu-west-1", ROLE_ARN, False, "vault.example.com")
    assert store.aws.sts_url == "https://sts.eu-west-1.amazonaws.com/"
    assert AwsAuth().sts_url == "https://sts.amazonaws.com/"
    assert AwsAuth("cn-north-1").sts_url == "https://sts.cn-north-1.amazonaws.com.cn/"
    assert "auth/aws aws role app" in store.describe()


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"vaultAuthType": "gcp"}, "vaultAuthType: 'gcp' is not supported yet"),
        ({"vaultAuthType": "azure"}, "vaultAuthType: 'azure' is not supported yet"),
        ({"vaultAuthType": "ldap"}, "expected one of kubernetes, jwt, aws"),
        ({"vaultAWSRegion": "us-east-1"}, "vaultAWSRegion: only used with vaultAuthType: aws"),
        ({"vaultAuthType": "aws", "vaultAWSRegion": "us east"}, "not a region name"),
        ({"vaultAuthType": "aws", "vaultAWSRoleArn": "app"}, "is not an IAM role ARN"),
        (
            {
                "vaultAuthType": "aws",
                "vaultAWSRoleArn": ROLE_ARN,
                "vaultAWSUsePodIdentity": "true",
            },
            "are both set",
        ),
        ({"vaultAuthType": "aws", "vaultAWSUsePodIdentity": "yes"}, "vaultAWSUsePodIdentity"),
        (
            {"vaultAuthType": "aws", "vaultAWSUsePodIdentity": "true", "audience": "vault"},
            "pods.eks.amazonaws.com",
        ),
        ({"vaultAuthType": "aws", "vaultAWSIAMServerID": "a\nb"}, "vaultAWSIAMServerID"),
        ({"vaultAuthType": "aws", "openbaoAuthType": "aws"}, "name the same setting"),
    ],
)
def test_problems_name_the_key(params: dict[str, str], named: str) -> None:
    assert named in problems(**params)


def test_the_new_keys_are_known_in_every_spelling() -> None:
    for key in ("vaultAuthType", "baoAWSRegion", "openbaoAWSRoleArn", "vaultAWSIAMServerID"):
        assert key in dialect.KEYS
