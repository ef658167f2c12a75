"""The stores, by name: the one list of them, read from the packages themselves.

A store is every subpackage `backends/<name>/` that has a `dialect` and a `store` module (the
file roles are in provider/core/backend.py). They are found by listing the package's folder
(pkgutil, no import: start-up stays fast), sorted by name, and imported only when used: the
dialect for `check` and planning, the options for the flags, the store (with its SDK) on
first Mount. Everything that needs the list of stores derives it from here: the flags, the
metric labels, `check`, the multi-store shapes (each dialect's `listed`), the SDK loggers that
`serve` quiets, and the tests' store lists.

Each module is checked as it is loaded against what provider/core/backend.py says a store is
(the `Dialect` and `Backend` protocols, `create` and `DIALECT`): one that does not conform is
refused with a NotAStore naming the store and what it lacks, rather than failing later with an
AttributeError in whichever layer first uses the missing member.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from collections.abc import Iterable, Mapping
from types import MappingProxyType, ModuleType
from typing import Any

import backends
from provider.core.backend import AnyBackend, AnyDialect, Backend, BackendEnv, Dialect
from provider.core.changes import Watched
from provider.core.selection import Selecting

#: The modules a subpackage of `backends` must have to be a store.
STORE_MODULES = frozenset({"dialect", "store"})


class NotAStore(TypeError):
    """A store's module lacks what every store provides (docs/architecture.md, "Adding a
    store"): a fault of the build, not of a class."""


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


def _module(name: str, role: str) -> ModuleType:
    try:
        package = PACKAGES[name]
    except KeyError:
        raise KeyError(f"no store {name!r} in backends/ (stores: {', '.join(names())})") from None
    return importlib.import_module(f"{package}.{role}")


def _members(protocol: type) -> list[str]:
    """A protocol's members: its annotated attributes and its methods."""
    methods = [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]
    return sorted({*protocol.__annotations__, *methods})


def _require(name: str, what: str, thing: object, members: Iterable[str], rule: str) -> None:
    """Refuse `thing` (the store's `what`) unless it has every one of `members`."""
    missing = [m for m in members if not hasattr(thing, m)]
    if missing:
        lacks = ", ".join(repr(m) for m in missing)
        raise NotAStore(f"store {name!r}: {what} has no {lacks} ({rule})")


_DIALECT_RULE = f"the Dialect protocol: {', '.join(_members(Dialect))}"
_STORE_RULE = "a store module: create(env) -> Backend, and DIALECT = its dialect module"
_BACKEND_RULE = f"the Backend protocol: {', '.join(_members(Backend))}"


@functools.cache
def _dialect(name: str) -> ModuleType:
    """The store's dialect module, checked against the Dialect protocol once (on first use)."""
    module = _module(name, "dialect")
    _require(name, f"backends/{name}/dialect.py", module, _members(Dialect), _DIALECT_RULE)
    return module


def dialect_module(name: str) -> AnyDialect:
    """The store's dialect module, as the Dialect protocol."""
    dialect: AnyDialect = _dialect(name)
    return dialect


def selecting(name: str) -> Selecting[Any, Any] | None:
    """The store's dialect as `Selecting` when it offers selectors (`select`), else None."""
    module = _dialect(name)
    if not hasattr(module, "selection"):
        return None
    dialect: Selecting[Any, Any] = module
    return dialect


def watched(name: str) -> Watched[Any, Any] | None:
    """The store's dialect as `Watched` when its refs have change-feed subjects, else None."""
    module = _dialect(name)
    if not hasattr(module, "subject"):
        return None
    dialect: Watched[Any, Any] = module
    return dialect


def enabled_by(name: str) -> str | None:
    """The provider flag a test store is accepted only with (its dialect's `ENABLED_BY`), or
    None for a store any class may name."""
    flag: str | None = getattr(_dialect(name), "ENABLED_BY", None)
    return flag


def options_class(name: str) -> type[Any]:
    """The store's Options dataclass; every store has one, and `Options()` is its defaults."""
    options: type[Any] = _module(name, "options").Options
    return options


def sdk_loggers() -> list[str]:
    """Every store's SDK loggers (`SDK_LOGGERS` in its options.py), which `serve` keeps quiet."""
    found: list[str] = []
    for name in names():
        module = _module(name, "options")
        found += [n for n in getattr(module, "SDK_LOGGERS", ()) if n not in found]
    return found


def create(env: BackendEnv[Any]) -> AnyBackend:
    """The store's Backend (its store.py, and with it its SDK, is imported here), once its
    module and the backend it builds are checked against the contract."""
    name = env.name
    module = _module(name, "store")
    where = f"backends/{name}/store.py"
    _require(name, where, module, ("create", "DIALECT"), _STORE_RULE)
    if module.DIALECT is not _dialect(name):
        raise NotAStore(f"store {name!r}: {where}'s DIALECT is not backends/{name}/dialect.py")
    backend: AnyBackend = module.create(env)
    _require(name, f"the backend {where} creates", backend, _members(Backend), _BACKEND_RULE)
    return backend
