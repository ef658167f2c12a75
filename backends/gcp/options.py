"""Provider-level flags of the gcp backend (`--gcp-<field>`, `SECRETS_BRIDGE_GCP_<FIELD>`).

The upstream provider read the project, cluster location and cluster name from the node's
metadata server; secrets-bridge takes them as flags so it runs (and is tested) anywhere. Every
Google endpoint is a flag too, so tests point the whole flow at local servers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_STS = "https://sts.googleapis.com/v1/token"
DEFAULT_IAM = "https://iamcredentials.googleapis.com"
DEFAULT_SECRETMANAGER = "secretmanager.googleapis.com:443"
#: Regional secrets are served only by their location's endpoint.
DEFAULT_REGIONAL = "secretmanager.{location}.rep.googleapis.com:443"
DEFAULT_PARAMETERMANAGER = "parametermanager.googleapis.com:443"
#: Regional parameters (`locations/<l>` other than `global`), as upstream's client_initiator.go.
DEFAULT_PARAMETERMANAGER_REGIONAL = "parametermanager.{location}.rep.googleapis.com:443"
#: The identity provider prefix of a GKE cluster in a workload identity audience.
DEFAULT_GKE_PROVIDER = "https://container.googleapis.com/v1"
#: The token_uri values of Google's own service account keys.
GOOGLE_TOKEN_URIS = (
    "https://oauth2.googleapis.com/token",
    "https://accounts.google.com/o/oauth2/token",
)


#: The SDK's loggers, kept at WARNING by `serve`: they log request details (headers, URLs).
SDK_LOGGERS: tuple[str, ...] = ("google", "urllib3")


@dataclass(frozen=True)
class Options:
    project: str | None = field(
        default=None,
        metadata={
            "help": "project id of the cluster's workload identity pool (<project>.svc.id.goog)"
        },
    )
    location: str | None = field(
        default=None, metadata={"help": "location (region or zone) of the GKE cluster"}
    )
    cluster: str | None = field(default=None, metadata={"help": "name of the GKE cluster"})
    workload_identity_audience: str | None = field(
        default=None,
        metadata={
            "help": "STS audience given whole, instead of --gcp-project/-location/-cluster: "
            "identitynamespace:<pool>:<provider> or //iam.googleapis.com/projects/<n>/locations/"
            "global/workloadIdentityPools/<pool>/providers/<provider>"
        },
    )
    sts_endpoint: str = field(
        default=DEFAULT_STS, metadata={"help": "STS token-exchange URL (RFC 8693)"}
    )
    iam_endpoint: str = field(
        default=DEFAULT_IAM,
        metadata={"help": "IAM credentials base URL (generateAccessToken for impersonation)"},
    )
    secretmanager_endpoint: str = field(
        default=DEFAULT_SECRETMANAGER, metadata={"help": "Secret Manager gRPC host:port"}
    )
    regional_endpoint: str = field(
        default=DEFAULT_REGIONAL,
        metadata={
            "help": "Secret Manager gRPC host:port for regional secrets; {location} is replaced"
        },
    )
    parametermanager_endpoint: str = field(
        default=DEFAULT_PARAMETERMANAGER,
        metadata={"help": "Parameter Manager gRPC host:port for locations/global parameters"},
    )
    parametermanager_regional_endpoint: str = field(
        default=DEFAULT_PARAMETERMANAGER_REGIONAL,
        metadata={
            "help": "Parameter Manager gRPC host:port for regional parameters; {location} is "
            "replaced"
        },
    )
    token_uris: str | None = field(
        default=None,
        metadata={
            "help": "comma-separated token_uri values a nodePublishSecretRef key.json may name "
            "besides Google's own (https://oauth2.googleapis.com/token, "
            "https://accounts.google.com/o/oauth2/token) and the origins of --gcp-sts-endpoint "
            "and --gcp-iam-endpoint; any other is refused, since the key's signed assertion "
            "and the provider's request would go there"
        },
    )
    ca_file: str | None = field(
        default=None,
        metadata={"help": "PEM bundle of CAs trusted for every Google endpoint (default: system)"},
    )
    local_channel: bool = field(
        default=False,
        metadata={
            "help": "TESTS ONLY: talk to Secret and Parameter Manager over gRPC local "
            "(loopback, unencrypted) channel credentials instead of TLS"
        },
    )
