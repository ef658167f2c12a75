"""Provider-level flags of the Azure backend (`--azure-<field>`, SECRETS_BRIDGE_AZURE_<FIELD>).

Real clusters need none of them: the cloud (from `cloudName` / `cloudEnvFileName`) decides the
authority and the vault DNS suffix, and identity bindings find their token proxy as upstream
does. They exist for sovereign or private endpoints and for tests, which run a local HTTPS
server that answers for the real host names.
"""

from dataclasses import dataclass, field

#: The SDK's loggers, kept at WARNING by `serve`: they log request details (headers, URLs).
SDK_LOGGERS: tuple[str, ...] = ("azure",)

#: Upstream's defaults for identity bindings (internal/identitybinding/identitybinding.go): the
#: API server's in-cluster name, and the CA of the provider's own service account.
DEFAULT_PROXY_URL = "https://kubernetes.default.svc.cluster.local"
DEFAULT_PROXY_CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"


@dataclass(frozen=True)
class Options:
    authority_host: str | None = field(
        default=None,
        metadata={
            "help": "Microsoft Entra authority host, overriding the cloud's "
            "(e.g. https://login.microsoftonline.com)",
            "env": ("AZURE_AUTHORITY_HOST",),
        },
    )
    vault_dns_suffix: str | None = field(
        default=None,
        metadata={"help": "Key Vault DNS suffix, overriding the cloud's (e.g. vault.azure.net)"},
    )
    ca_file: str | None = field(
        default=None,
        metadata={"help": "PEM bundle of CAs trusted for Entra and Key Vault (default: system)"},
    )
    connect_to: str | None = field(
        default=None,
        metadata={
            "help": "HOST:PORT every Entra and Key Vault connection goes to instead of the "
            "address DNS gives (a private endpoint or proxy; tests use a local server); TLS "
            "still verifies the real host name (the token proxy of identity bindings is dialled "
            "as its URL says)"
        },
    )
    token_proxy_url: str | None = field(
        default=None,
        metadata={
            "help": "The AKS token proxy of identity bindings (useAzureTokenProxy), as "
            "upstream's --token-proxy-url (default: "
            f"{DEFAULT_PROXY_URL}, the API server)",
            "env": ("AZURE_KUBERNETES_TOKEN_PROXY",),
        },
    )
    sni_name: str | None = field(
        default=None,
        metadata={
            "help": "TLS server name sent to the token proxy, as upstream's --sni-name "
            "(default: computed from the cluster id in the API server's certificate)",
            "env": ("AZURE_KUBERNETES_SNI_NAME",),
        },
    )
    token_proxy_ca_file: str | None = field(
        default=None,
        metadata={
            "help": "PEM bundle of CAs trusted for the token proxy (default: "
            f"{DEFAULT_PROXY_CA_FILE} when present, else the system's)",
            "env": ("AZURE_KUBERNETES_CA_FILE",),
        },
    )
