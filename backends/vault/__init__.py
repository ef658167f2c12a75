"""Vault / OpenBao backend, compatible with vault-csi-provider's (and OpenBao's) parameters."""
