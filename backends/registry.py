"""Backends by name, imported only when used (start-up stays fast; SDKs load on first Mount).

Each package follows the layout in backends/base.py: `params` (dialect parser, no SDK),
`options` (provider-level flags), `store` (the Backend, with its SDK).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any

from provider.core.model import Backend, BackendEnv

PACKAGES: dict[str, str] = {
    "vault": "backends.vault",
    "aws": "backends.aws",
    "gcp": "backends.gcp",
    "azure": "backends.azure",
    "fake": "backends.fake",
}


def names() -> list[str]:
    """Backends present in this build."""
    return [n for n, pkg in PACKAGES.items() if importlib.util.find_spec(pkg) is not None]


def dialect_module(name: str) -> ModuleType:
    return importlib.import_module(f"{PACKAGES[name]}.dialect")


def options_class(name: str) -> type[Any] | None:
    try:
        module = importlib.import_module(f"{PACKAGES[name]}.options")
    except ModuleNotFoundError:
        return None
    options: type[Any] = module.Options
    return options


def create(env: BackendEnv) -> Backend:
    module = importlib.import_module(f"{PACKAGES[env.name]}.store")
    backend: Backend = module.create(env)
    return backend
