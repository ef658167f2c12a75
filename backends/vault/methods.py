"""Which Vault auth method a class logs in with, and that method's settings (no SDK import).

    vaultAuthType: kubernetes        # default: auth/<mount>/login {role, jwt}, mount kubernetes
    vaultAuthType: jwt               # the same login, default mount jwt
    vaultAuthType: aws               # Vault's aws method, iam type, default mount aws:
    vaultAWSRegion: us-east-1        #   the STS region the request is signed for (default
                                     #   us-east-1, whose endpoint is sts.amazonaws.com)
    vaultAWSRoleArn: arn:aws:iam::111122223333:role/app   # IRSA role; default: the
                                     #   ServiceAccount's eks.amazonaws.com/role-arn annotation
    vaultAWSUsePodIdentity: "true"   # EKS Pod Identity instead of IRSA
    vaultAWSIAMServerID: vault.example.com   # X-Vault-AWS-IAM-Server-ID, signed, when the
                                     #   method's config sets iam_server_id_header_value
    vaultAuthType: gcp               # Vault's gcp method, iam type, default mount gcp:
    vaultGCPWorkloadIdentityAudience: //iam.googleapis.com/projects/1/locations/global/...
                                     #   the STS audience (or identitynamespace:<pool>:<provider>)
    vaultGCPServiceAccount: app@p.iam.gserviceaccount.com   # the Google service account the
                                     #   JWT is signed for; default: the ServiceAccount's
                                     #   iam.gke.io/gcp-service-account annotation
    vaultAuthType: azure             # Vault's azure method, default mount azure:
    vaultAzureTenantID: <tenant>     #   the pod's workload identity: tenant and client id
    vaultAzureClientID: <client id>  #   (both required)
    vaultAzureResource: https://management.azure.com/   # the method's configured `resource`
    vaultAzureSubscriptionID, vaultAzureResourceGroup, vaultAzureVMName | vaultAzureVMSSName
                                     #   the login's subscription_id, resource_group_name,
                                     #   vm_name / vmss_name (roles with bound resources)

`audience` is the audience of the pod token the login uses: for aws, the web identity token
(default sts.amazonaws.com; pods.eks.amazonaws.com with Pod Identity, which the agent requires);
for gcp, the workload identity pool's (the pool of an identitynamespace audience, else the STS
audience whole, as the gcp backend takes them); for azure, api://AzureADTokenExchange.
Upstream vault-csi-provider has no cloud auth yet (its AWS IAM pull request, #333, is open;
Azure: issue #47), so the names follow its `vault*` style; every key has `bao*` and `openbao*`
spellings too (`CLOUD_KEYS` lists the suffixes the dialect spells them with).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from backends.clouds.names import AZURE_AUDIENCE, IRSA_AUDIENCE, POD_IDENTITY_AUDIENCE
from provider.core.parsing import Problems, go_bool

DEFAULT_AZURE_RESOURCE = "https://management.azure.com/"
DEFAULT_AWS_REGION = "us-east-1"
#: The methods a class may name, and the mount each uses when the class names none.
DEFAULT_MOUNTS = {
    "kubernetes": "kubernetes",
    "jwt": "jwt",
    "aws": "aws",
    "gcp": "gcp",
    "azure": "azure",
}
AWS_SETTINGS = ("aws_region", "aws_role_arn", "aws_pod_identity", "aws_server_id")
#: The gcp and azure methods' settings -> the key suffix after vault / bao / openbao.
GCP_KEYS = {
    "gcp_service_account": "GCPServiceAccount",
    "gcp_wi_audience": "GCPWorkloadIdentityAudience",
}
AZURE_KEYS = {
    "azure_tenant": "AzureTenantID",
    "azure_client": "AzureClientID",
    "azure_resource": "AzureResource",
    "azure_subscription": "AzureSubscriptionID",
    "azure_group": "AzureResourceGroup",
    "azure_vm": "AzureVMName",
    "azure_vmss": "AzureVMSSName",
}
CLOUD_KEYS = {**GCP_KEYS, **AZURE_KEYS}
_SETTINGS = {"aws": AWS_SETTINGS, "gcp": tuple(GCP_KEYS), "azure": tuple(AZURE_KEYS)}
# botocore's own region check (a host name label); an ARN as the AWS backend accepts it.
_REGION = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?$")
_ROLE_ARN = re.compile(r"^arn:[\w-]+:iam::\d{12}:role/[\w+=,.@/-]+$")
_HEADER_VALUE = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$")
# A Google service account email; it becomes part of the IAM URL that receives the token.
_GSA = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+$")
_WI_AUDIENCE = re.compile(r"^(identitynamespace:[^:\s]+:\S+|//iam\.googleapis\.com/\S+)$")
# Tenants are GUIDs or domain names, client and subscription ids GUIDs (backends/azure's
# rule); Azure's own name rules for resource groups and VM / scale set names.
_DIRECTORY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")
_GUID = re.compile(r"^[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
_GROUP = re.compile(r"^[-\w._()]{1,90}$")
_VM = re.compile(r"^[-\w.]{1,64}$")


@dataclass(frozen=True)
class AwsAuth:
    """The aws method's settings: where the GetCallerIdentity request is signed for, and
    which of the pod's AWS identities signs it."""

    region: str = DEFAULT_AWS_REGION
    role_arn: str = ""
    pod_identity: bool = False
    server_id: str = ""

    @property
    def sts_url(self) -> str:
        """The URL the request is signed for; Vault sends it to its configured sts_endpoint
        with this host, which the signature covers (us-east-1 is Vault's default, global)."""
        if self.region == DEFAULT_AWS_REGION:
            return "https://sts.amazonaws.com/"
        suffix = ".amazonaws.com.cn" if self.region.startswith("cn-") else ".amazonaws.com"
        return f"https://sts.{self.region}{suffix}/"


@dataclass(frozen=True)
class GcpAuth:
    """The gcp method's settings: the pool the pod's token is exchanged at, and the Google
    service account the login JWT is signed for (empty: the ServiceAccount's annotation)."""

    sts_audience: str
    service_account: str = ""

    @property
    def token_audience(self) -> str:
        """The pod token's audience, as the gcp backend takes it: a GKE pool's name, else the
        STS audience whole."""
        parts = self.sts_audience.split(":")
        return (
            parts[1] if parts[0] == "identitynamespace" and len(parts) >= 3 else self.sts_audience
        )


@dataclass(frozen=True)
class AzureAuth:
    """The azure method's settings: the pod's workload identity (tenant, client), the resource
    its Entra token is for (the method's `resource`), and the login's resource fields."""

    tenant_id: str
    client_id: str
    resource: str = DEFAULT_AZURE_RESOURCE
    subscription_id: str = ""
    resource_group: str = ""
    vm_name: str = ""
    vmss_name: str = ""

    def login_fields(self) -> dict[str, str]:
        fields = {
            "subscription_id": self.subscription_id,
            "resource_group_name": self.resource_group,
            "vm_name": self.vm_name,
            "vmss_name": self.vmss_name,
        }
        return {k: v for k, v in fields.items() if v}


@dataclass(frozen=True)
class Method:
    name: str
    default_mount: str
    default_audience: str
    aws: AwsAuth | None = None
    gcp: GcpAuth | None = None
    azure: AzureAuth | None = None


def parse_method(
    values: Mapping[str, str],
    written: Callable[[str], str],
    problems: Problems,
    default_audience: str,
) -> Method:
    """The class's auth method; `written(name)` is the spelling the class used (messages)."""
    name = values["auth_type"].lower() or "kubernetes"
    if name not in DEFAULT_MOUNTS:
        problems.add(
            f"{written('auth_type')}: expected one of {', '.join(DEFAULT_MOUNTS)}, got "
            f"{values['auth_type']!r}"
        )
    for method, settings in _SETTINGS.items():
        extra = [written(s) for s in settings if values.get(s)] if method != name else []
        if extra:
            problems.add(f"{', '.join(extra)}: only used with {written('auth_type')}: {method}")
    if name == "gcp":
        gcp = _parse_gcp(values, written, problems)
        return Method("gcp", "gcp", gcp.token_audience if gcp else "", gcp=gcp)
    if name == "azure":
        azure = _parse_azure(values, written, problems)
        return Method("azure", "azure", AZURE_AUDIENCE, azure=azure)
    if name != "aws":
        return Method(name, DEFAULT_MOUNTS.get(name, "kubernetes"), default_audience)
    aws = _parse_aws(values, written, problems)
    audience = POD_IDENTITY_AUDIENCE if aws.pod_identity else IRSA_AUDIENCE
    given = values["audience"]
    if aws.pod_identity and given and given != POD_IDENTITY_AUDIENCE:
        problems.add(
            f"audience: EKS Pod Identity takes the pod's token for {POD_IDENTITY_AUDIENCE!r} "
            f"only; remove audience {given!r}"
        )
    return Method("aws", "aws", audience, aws)


def _parse_aws(
    values: Mapping[str, str], written: Callable[[str], str], problems: Problems
) -> AwsAuth:
    region = values["aws_region"] or DEFAULT_AWS_REGION
    if not _REGION.match(region):
        problems.add(f"{written('aws_region')}: {region!r} is not a region name such as us-east-1")
    role_arn = values["aws_role_arn"]
    if role_arn and not _ROLE_ARN.match(role_arn):
        problems.add(
            f"{written('aws_role_arn')}: {role_arn!r} is not an IAM role ARN "
            "(arn:aws:iam::111122223333:role/name)"
        )
    pod_identity = go_bool(
        values["aws_pod_identity"], written("aws_pod_identity"), problems, default=False
    )
    if pod_identity and role_arn:
        problems.add(
            f"{written('aws_role_arn')} and {written('aws_pod_identity')} are both set: EKS Pod "
            "Identity chooses the role from its association; remove one"
        )
    server_id = values["aws_server_id"]
    if server_id and not _HEADER_VALUE.match(server_id):
        problems.add(
            f"{written('aws_server_id')}: a header value of printable ASCII, without leading "
            "or trailing spaces, e.g. vault.example.com"
        )
    return AwsAuth(region, role_arn, pod_identity, server_id)


def _parse_gcp(
    values: Mapping[str, str], written: Callable[[str], str], problems: Problems
) -> GcpAuth | None:
    audience = values.get("gcp_wi_audience", "")
    if not audience:
        problems.add(
            f"{written('gcp_wi_audience')} is required with {written('auth_type')}: gcp: the "
            "workload identity pool the pod's token is exchanged at, e.g. "
            "identitynamespace:<project>.svc.id.goog:https://container.googleapis.com/v1/"
            "projects/<project>/locations/<location>/clusters/<cluster> or //iam.googleapis.com/"
            "projects/<number>/locations/global/workloadIdentityPools/<pool>/providers/<provider>"
        )
    elif not _WI_AUDIENCE.match(audience):
        problems.add(
            f"{written('gcp_wi_audience')}: {audience!r} is not a workload identity audience "
            "(identitynamespace:<pool>:<provider> or //iam.googleapis.com/...)"
        )
    account = values.get("gcp_service_account", "")
    if account and not _GSA.match(account):
        problems.add(
            f"{written('gcp_service_account')}: {account!r} is not a Google service account "
            "email (name@project.iam.gserviceaccount.com)"
        )
    return GcpAuth(audience, account) if audience else None


def _parse_azure(
    values: Mapping[str, str], written: Callable[[str], str], problems: Problems
) -> AzureAuth:
    def check(name: str, pattern: re.Pattern[str], what: str, required: bool = False) -> str:
        value = values.get(name, "")
        if required and not value:
            problems.add(f"{written(name)} is required with {written('auth_type')}: azure: {what}")
        elif value and not pattern.match(value):
            problems.add(f"{written(name)}: {value!r} is not {what}")
        return value

    tenant = check("azure_tenant", _DIRECTORY_ID, "a tenant id (GUID) or domain name", True)
    client = check(
        "azure_client", _GUID, "the client id (a GUID) of the pod's workload identity", True
    )
    resource = values.get("azure_resource", "") or DEFAULT_AZURE_RESOURCE
    if not resource.startswith(("https://", "api://")) or any(c.isspace() for c in resource):
        problems.add(
            f"{written('azure_resource')}: {resource!r} is not a resource URI such as "
            f"{DEFAULT_AZURE_RESOURCE} (the azure method's configured resource)"
        )
    subscription = check("azure_subscription", _GUID, "a subscription id (GUID)")
    group = check("azure_group", _GROUP, "a resource group name")
    vm = check("azure_vm", _VM, "a virtual machine name")
    vmss = check("azure_vmss", _VM, "a virtual machine scale set name")
    if vm and vmss:
        problems.add(
            f"{written('azure_vm')} and {written('azure_vmss')} are both set: the login names "
            "one virtual machine or one scale set; remove one"
        )
    return AzureAuth(tenant, client, resource, subscription, group, vm, vmss)
