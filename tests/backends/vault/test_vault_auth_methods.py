"""vaultAuthType and the cloud methods' keys: defaults, audiences, and every problem named."""

from __future__ import annotations

import pytest

from backends.vault import dialect
from backends.vault.methods import AwsAuth, AzureAuth, GcpAuth
from backends.vault.options import Options
from provider.core.model import ParseContext
from provider.core.parsing import InvalidClass

OBJECTS = "- {objectName: a, secretPath: secret/data/a, secretKey: k}"
ROLE_ARN = "arn:aws:iam::111122223333:role/app"
GKE = "identitynamespace:proj.svc.id.goog:https://container.googleapis.com/v1/projects/p/x"
WIF = "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/k"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
CLIENT = "11111111-2222-3333-4444-555555555555"
AZURE = {"vaultAuthType": "azure", "vaultAzureTenantID": TENANT, "vaultAzureClientID": CLIENT}


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
        (
            {"vaultAuthType": "gcp", "vaultGCPWorkloadIdentityAudience": GKE},
            ("gcp", "gcp", "proj.svc.id.goog"),
        ),
        ({"vaultAuthType": "gcp", "baoGCPWorkloadIdentityAudience": WIF}, ("gcp", "gcp", WIF)),
        (AZURE, ("azure", "azure", "api://AzureADTokenExchange")),
        ({**AZURE, "audience": "api://custom"}, ("azure", "azure", "api://custom")),
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


def test_the_gcp_and_azure_settings() -> None:
    gcp = parse(
        vaultAuthType="gcp",
        vaultGCPWorkloadIdentityAudience=GKE,
        vaultGCPServiceAccount="app@p.iam.gserviceaccount.com",
    )
    assert gcp.gcp == GcpAuth(GKE, "app@p.iam.gserviceaccount.com") and gcp.azure is None
    azure = parse(
        **AZURE,
        vaultAzureSubscriptionID=CLIENT,
        vaultAzureResourceGroup="rg-1",
        vaultAzureVMSSName="aks-nodes",
    )
    assert azure.azure == AzureAuth(
        TENANT, CLIENT, "https://management.azure.com/", CLIENT, "rg-1", "", "aks-nodes"
    )
    assert azure.azure.login_fields() == {
        "subscription_id": CLIENT,
        "resource_group_name": "rg-1",
        "vmss_name": "aks-nodes",
    }


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"vaultAuthType": "gcp"}, "vaultGCPWorkloadIdentityAudience is required"),
        (
            {"vaultAuthType": "gcp", "vaultGCPWorkloadIdentityAudience": "pool"},
            "is not a workload identity audience",
        ),
        (
            {
                "vaultAuthType": "gcp",
                "vaultGCPWorkloadIdentityAudience": GKE,
                "vaultGCPServiceAccount": "app",
            },
            "is not a Google service account email",
        ),
        ({"vaultGCPServiceAccount": "a@b.c"}, "only used with vaultAuthType: gcp"),
        ({"vaultAuthType": "azure"}, "vaultAzureTenantID is required"),
        ({"vaultAuthType": "azure"}, "vaultAzureClientID is required"),
        ({**AZURE, "vaultAzureClientID": "app"}, "vaultAzureClientID: 'app' is not the client id"),
        ({**AZURE, "vaultAzureResource": "management"}, "is not a resource URI"),
        ({**AZURE, "vaultAzureSubscriptionID": "sub"}, "is not a subscription id"),
        (
            {**AZURE, "vaultAzureVMName": "vm", "vaultAzureVMSSName": "ss"},
            "vaultAzureVMName and vaultAzureVMSSName are both set",
        ),
        ({"vaultAzureTenantID": TENANT}, "only used with vaultAuthType: azure"),
        (
            {"vaultAuthType": "aws", "vaultAzureResource": "https://x/"},
            "vaultAzureResource: only used with vaultAuthType: azure",
        ),
        ({"vaultAuthType": "ldap"}, "expected one of kubernetes, jwt, aws, gcp, azure"),
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
    for key in (
        "vaultAuthType",
        "baoAWSRegion",
        "openbaoAWSRoleArn",
        "vaultAWSIAMServerID",
        "vaultGCPServiceAccount",
        "baoGCPWorkloadIdentityAudience",
        "openbaoAzureTenantID",
        "vaultAzureClientID",
        "vaultAzureResource",
        "vaultAzureSubscriptionID",
        "vaultAzureResourceGroup",
        "vaultAzureVMName",
        "vaultAzureVMSSName",
    ):
        assert key in dialect.KEYS
