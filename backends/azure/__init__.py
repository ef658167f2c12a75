"""Azure Key Vault backend: secrets, keys and certificates, with the Azure provider's parameters."""
