"""Provider-level flags of the vault backend (`--vault-<field>`, SECRETS_BRIDGE_VAULT_<FIELD>)."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Options:
    addr: str | None = field(
        default=None,
        metadata={
            "help": "default Vault/OpenBao address when a class sets no vaultAddress",
            "env": ("VAULT_ADDR", "BAO_ADDR"),
        },
    )
    max_connections: int = field(
        default=64,
        metadata={
            "help": "open HTTP connections per Vault address (bounds a rollout's load on Vault)"
        },
    )
    token_renew_margin: float = field(
        default=0.2,
        metadata={
            "help": "fraction of a Vault token's lease left when it is replaced by a new login"
        },
    )
