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

`audience` is the audience of the pod token the login uses: for aws, the web identity token
(default sts.amazonaws.com; pods.eks.amazonaws.com with Pod Identity, which the agent requires).
Upstream vault-csi-provider has no cloud auth yet (its AWS IAM pull request, #333, is open), so
the names follow its `vault*` style; every key has `bao*` and `openbao*` spellings too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from provider.core.parsing import Problems, go_bool

IRSA_AUDIENCE = "sts.amazonaws.com"
POD_IDENTITY_AUDIENCE = "pods.eks.amazonaws.com"
DEFAULT_AWS_REGION = "us-east-1"
#: The methods a class may name, and the mount each uses when the class names none.
DEFAULT_MOUNTS = {"kubernetes": "kubernetes", "jwt": "jwt", "aws": "aws"}
#: Cloud methods of Vault that are not served yet: refused by name, with what to use instead.
NOT_YET = ("gcp", "azure")
AWS_SETTINGS = ("aws_region", "aws_role_arn", "aws_pod_identity", "aws_server_id")
# botocore's own region check (a host name label); an ARN as the AWS backend accepts it.
_REGION = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?$")
_ROLE_ARN = re.compile(r"^arn:[\w-]+:iam::\d{12}:role/[\w+=,.@/-]+$")
_HEADER_VALUE = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$")


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
class Method:
    name: str
    default_mount: str
    default_audience: str
    aws: AwsAuth | None = None


def parse_method(
    values: Mapping[str, str],
    written: Callable[[str], str],
    problems: Problems,
    default_audience: str,
) -> Method:
    """The class's auth method; `written(name)` is the spelling the class used (messages)."""
    name = values["auth_type"].lower() or "kubernetes"
    if name in NOT_YET:
        problems.add(
            f"{written('auth_type')}: {name!r} is not supported yet; log in with kubernetes, "
            "jwt or aws (or use the store's own backend: backend: gcp / azure)"
        )
    elif name not in DEFAULT_MOUNTS:
        problems.add(
            f"{written('auth_type')}: expected one of {', '.join(DEFAULT_MOUNTS)}, got "
            f"{values['auth_type']!r}"
        )
    if name != "aws":
        extra = [written(s) for s in AWS_SETTINGS if values[s]]
        if extra:
            problems.add(f"{', '.join(extra)}: only used with {written('auth_type')}: aws")
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
