"""Provider-level flags of the Azure backend (`--azure-<field>`, SECRETS_BRIDGE_AZURE_<FIELD>).

Real clusters need none of them: the cloud (from `cloudName` / `cloudEnvFileName`) decides the
authority and the vault DNS suffix. They exist for sovereign or private endpoints and for tests,
which run a local HTTPS server that answers for the real host names.
"""

from dataclasses import dataclass, field

#: The SDK's loggers, kept at WARNING by `serve`: they log request details (headers, URLs).
SDK_LOGGERS: tuple[str, ...] = ("azure",)


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
            "still verifies the real host name"
        },
    )
