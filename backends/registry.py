"""The stores, by name: the one list of them, read from the packages themselves.

A store is every subpackage `backends/<name>/` that has a `dialect` and a `store` module (the
file roles are in provider/core/backend.py). They are found by listing the package's folder
(pkgutil, no import: start-up stays fast), sorted by name, and imported only when used: the
dialect for `check` and planning, the options for the flags, the store (with its SDK) on
first Mount. Everything that needs the list of stores derives it from here: the flags, the
metric labels, `check`, the multi-store shapes (each dialect's `listed`), the SDK loggers that
`serve` quiets, and the tests' store lists.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import backends
from provider.core.backend import AnyBackend, AnyDialect, BackendEnv
from provider.core.selection import Selecting

#: The modules a subpackage of `backends` must have to be a store.
STORE_MODULES = frozenset({"dialect", "store"})


def _discover() -> Mapping[str, str]:
    """name -> package of every store folder, sorted by name (listed, not imported)."""
    found: dict[str, str] = {}
    for package in pkgutil.iter_modules(backends.__path__):
        if not package.ispkg or package.name.startswith("_"):
            continue
        folders = [os.path.join(path, package.name) for path in backends.__path__]
        if STORE_MODULES.issubset(m.name for m in pkgutil.iter_modules(folders)):
            found[package.name] = f"{backends.__name__}.{package.name}"
    return MappingProxyType(dict(sorted(found.items())))


#: Store name -> its package, from the folders (read-only).
PACKAGES: Mapping[str, str] = _discover()


def names() -> list[str]:
    """The stores present in this build, sorted by name."""
    return list(PACKAGES)


def _package(name: str) -> str:
    try:
        return PACKAGES[name]
    except KeyError:
        raise KeyError(f"no store {name!r} in backends/ (stores: {', '.join(names())})") from None


def dialect_module(name: str) -> AnyDialect:
    """The store's dialect module, as the Dialect protocol (each store.py has mypy check it)."""
    module: AnyDialect = importlib.import_module(f"{_package(name)}.dialect")
    return module


def selecting(name: str) -> Selecting[Any, Any] | None:
    """The store's dialect as `Selecting` when it offers selectors (`select`), else None."""
    module = importlib.import_module(f"{_package(name)}.dialect")
    if not hasattr(module, "selection"):
        return None
    dialect: Selecting[Any, Any] = module
    return dialect


def options_class(name: str) -> type[Any]:
    """The store's Options dataclass; every store has one, and `Options()` is its defaults."""
    module = importlib.import_module(f"{_package(name)}.options")
    options: type[Any] = module.Options
    return options


def sdk_loggers() -> list[str]:
    """Every store's SDK loggers (`SDK_LOGGERS` in its options.py), which `serve` keeps quiet."""
    found: list[str] = []
    for name in names():
        module = importlib.import_module(f"{_package(name)}.options")
        found += [n for n in getattr(module, "SDK_LOGGERS", ()) if n not in found]
    return found


def create(env: BackendEnv[Any]) -> AnyBackend:
    """The store's Backend (its store.py, and with it its SDK, is imported here)."""
    module = importlib.import_module(f"{_package(env.name)}.store")
    backend: AnyBackend = module.create(env)
    return backend
