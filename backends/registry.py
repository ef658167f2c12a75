"""Backends by name, imported only when used (start-up stays fast; SDKs load on first Mount).

Each package follows the file roles in provider/core/backend.py: `dialect` (parameters, no SDK),
`options` (provider-level flags), `auth`, `client`, `store` (the Backend, with its SDK).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from provider.core.backend import AnyBackend, AnyDialect, BackendEnv

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


def dialect_module(name: str) -> AnyDialect:
    """The store's dialect module, as the Dialect protocol (each store.py has mypy check it)."""
    module: AnyDialect = importlib.import_module(f"{PACKAGES[name]}.dialect")
    return module


def options_class(name: str) -> type[Any]:
    """The store's Options dataclass; every store has one, and `Options()` is its defaults."""
    module = importlib.import_module(f"{PACKAGES[name]}.options")
    options: type[Any] = module.Options
    return options


def sdk_loggers() -> list[str]:
    """Every store's SDK loggers (`SDK_LOGGERS` in its options.py), which `serve` keeps quiet."""
    found: list[str] = []
    for name in names():
        module = importlib.import_module(f"{PACKAGES[name]}.options")
        found += [n for n in getattr(module, "SDK_LOGGERS", ()) if n not in found]
    return found


def create(env: BackendEnv[Any]) -> AnyBackend:
    module = importlib.import_module(f"{PACKAGES[env.name]}.store")
    backend: AnyBackend = module.create(env)
    return backend
