"""Provider-level flags of the vault backend (`--vault-<field>`, SECRETS_BRIDGE_VAULT_<FIELD>).

As with vault-csi-provider, the connection settings are provider-level defaults that a class
overrides field by field; the standard Vault client environment variables (VAULT_ADDR,
VAULT_CACERT, ...) are accepted too, and OpenBao's BAO_ADDR.
"""

from dataclasses import dataclass, field

#: The SDK's loggers, kept at WARNING by `serve`: they log request details (headers, URLs);
#: botocore's DEBUG lines hold the pod's web identity token and the signed login of the aws
#: auth method (backends/vault/awslogin.py).
SDK_LOGGERS: tuple[str, ...] = ("botocore", "aiobotocore")


@dataclass(frozen=True)
class Options:
    addr: str | None = field(
        default=None,
        metadata={
            "help": "default Vault/OpenBao address when a class sets no vaultAddress",
            "env": ("VAULT_ADDR", "BAO_ADDR"),
        },
    )
    namespace: str | None = field(
        default=None,
        metadata={
            "help": "default Vault namespace (class: vaultNamespace)",
            "env": ("VAULT_NAMESPACE",),
        },
    )
    ca_cert: str | None = field(
        default=None,
        metadata={
            "help": "default CA certificate file (class: vaultCACertPath)",
            "env": ("VAULT_CACERT",),
        },
    )
    ca_dir: str | None = field(
        default=None,
        metadata={
            "help": "default CA directory (class: vaultCADirectory)",
            "env": ("VAULT_CAPATH",),
        },
    )
    tls_server_name: str | None = field(
        default=None,
        metadata={
            "help": "default TLS server name (class: vaultTLSServerName)",
            "env": ("VAULT_TLS_SERVER_NAME",),
        },
    )
    client_cert: str | None = field(
        default=None,
        metadata={
            "help": "default TLS client certificate (class: vaultTLSClientCertPath)",
            "env": ("VAULT_CLIENT_CERT",),
        },
    )
    client_key: str | None = field(
        default=None,
        metadata={
            "help": "default TLS client key (class: vaultTLSClientKeyPath)",
            "env": ("VAULT_CLIENT_KEY",),
        },
    )
    skip_verify: bool = field(
        default=False,
        metadata={
            "help": "skip TLS verification unless a class sets vaultSkipTLSVerify (tests only)",
            "env": ("VAULT_SKIP_VERIFY",),
        },
    )
    max_connections: int = field(
        default=64,
        metadata={
            "help": "open HTTP connections per Vault address (bounds a rollout's load on Vault)"
        },
    )
    request_timeout: float = field(
        default=0.0,
        metadata={
            "help": "seconds one Vault request may take before it counts as unavailable and "
            "is retried, when shorter than --store-call-timeout (0 = that timeout); dynamic "
            "secrets can take a few seconds"
        },
    )
    token_renew_margin: float = field(
        default=0.2,
        metadata={
            "help": "fraction of a Vault token's lease left when it is replaced by a new login"
        },
    )
