"""secrets-bridge: a Secrets Store CSI driver provider for Vault/OpenBao, AWS, Google and Azure."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("secrets-bridge")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0"
