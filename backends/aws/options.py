"""Provider-level flags of the AWS backend (`--aws-<field>`, `SECRETS_BRIDGE_AWS_<FIELD>`).

The standard SDK variables (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_SECRETS_MANAGER`,
`AWS_ENDPOINT_URL_SSM`, `AWS_ENDPOINT_URL_STS`, ...) keep working: botocore reads them whenever
no endpoint is set here. `endpoints` exists because those variables are per service, not per
region, so they cannot point two regions at two emulators (failover tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.clouds.names import POD_IDENTITY_IPV4, POD_IDENTITY_IPV6
from provider.core.errors import InvalidParameters

#: The SDK's loggers, kept at WARNING by `serve`: they log request details (headers, URLs).
SDK_LOGGERS: tuple[str, ...] = ("botocore", "aiobotocore", "urllib3")


@dataclass(frozen=True)
class Options:
    region: str | None = field(
        default=None,
        metadata={
            "help": "default region for classes without a 'region' parameter",
            "env": ("AWS_REGION", "AWS_DEFAULT_REGION"),
        },
    )
    endpoints: str | None = field(
        default=None,
        metadata={
            "help": "per-region endpoint overrides for every AWS service, e.g. "
            "'us-east-1=http://127.0.0.1:5000,eu-west-1=http://127.0.0.1:5001'"
        },
    )
    sts_endpoint: str | None = field(
        default=None,
        metadata={
            "help": "STS endpoint of every STS call: the aws store's AssumeRoleWithWebIdentity "
            "and assumeRoleArn's AssumeRole, and Vault's vaultAuthType aws login (default: "
            "regional STS, or AWS_ENDPOINT_URL_STS)"
        },
    )
    pod_identity_endpoint: str | None = field(
        default=None,
        metadata={
            "help": "EKS Pod Identity agent credentials URL (default: the agent's link-local "
            f"address, {POD_IDENTITY_IPV4} or {POD_IDENTITY_IPV6} by preferredAddressType)"
        },
    )
    max_concurrency: int = field(
        default=32,
        metadata={"help": "store calls in flight at once from this provider (quota guard)"},
    )
    revalidate_max_age: float = field(
        default=600.0,
        metadata={
            "help": "seconds a Secrets Manager value may be confirmed by DescribeSecret instead "
            "of re-read (0 = off); the value stays in memory that long",
            # The spelling of the first release, kept: it is in every existing DaemonSet.
            "flags": ("--revalidate-max-age",),
            "env": ("SECRETS_BRIDGE_REVALIDATE_MAX_AGE",),
        },
    )
    connect_timeout: float = field(
        default=3.0, metadata={"help": "seconds to wait for a connection to an AWS endpoint"}
    )
    read_timeout: float = field(
        default=10.0, metadata={"help": "seconds to wait for an AWS response"}
    )


def endpoint_map(text: str | None) -> dict[str, str]:
    """Parse `region=url,region=url` (the `--aws-endpoints` flag)."""
    result: dict[str, str] = {}
    problems: list[str] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        region, sep, url = item.partition("=")
        region, url = region.strip(), url.strip()
        if not sep or not region or not url.startswith(("http://", "https://")):
            problems.append(
                f"--aws-endpoints: {item!r} is not region=http(s)://host:port "
                "(e.g. us-east-1=http://127.0.0.1:5000)"
            )
            continue
        if region in result:
            problems.append(f"--aws-endpoints: region {region!r} is listed twice")
        result[region] = url
    if problems:
        raise InvalidParameters(problems)
    return result
