"""The store contract is checked by mypy (issue 34): each store's `create` is typed as the
`Backend` protocol and each `store.py` assigns its dialect module to a `Dialect`, so a store
whose backend or dialect drifts from the protocol fails `make lint`. Shown here on broken copies
of the fake store's modules, type-checked with the project's own mypy settings. The registry
checks the same members as it loads a store (issue 42), and every store ships its tests."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends import registry
from devkit.testing import make_env

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "backends" / "fake"
#: What `tests/backends/<name>/` holds for every store: `test_<name>_<role>.py`, its dialect,
#: whom it reads as, its reads, its errors and a Mount of it. A test store (fake, whose dialect
#: says the flag it needs) is exercised by the core's and the mount layer's tests instead.
SHIPPED = ("dialect", "identity", "fetch", "errors", "mount")


@pytest.mark.parametrize("name", [n for n in registry.names() if not registry.enabled_by(n)])
def test_every_store_ships_its_tests(name: str) -> None:
    folder = ROOT / "tests" / "backends" / name
    files = [f"test_{name}_{role}.py" for role in SHIPPED]
    missing = [f for f in files if not (folder / f).is_file()]
    assert not missing, f"store {name!r}: tests/backends/{name}/ lacks {', '.join(missing)}"


def mypy(tmp_path: Path, *files: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MYPYPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *files],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_untouched_copies_pass(tmp_path: Path) -> None:
    (tmp_path / "copied_store.py").write_text((FAKE / "store.py").read_text())
    result = mypy(tmp_path, "copied_store.py")
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("    async def fetch(\n", "    async def fetch_all(\n", "Incompatible return value type"),
        ("    async def close(self)", "    async def shut(self)", "Incompatible return value type"),
    ],
)
def test_a_backend_drifting_from_the_protocol_fails_mypy(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    source = (FAKE / "store.py").read_text()
    assert old in source
    (tmp_path / "broken_store.py").write_text(source.replace(old, new))
    result = mypy(tmp_path, "broken_store.py")
    assert result.returncode == 1 and expected in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("old", "new", "missing"),
    [
        ("def audiences(", "def audience(", "audiences"),
        ("def lifetime(", "def lifetimes(", "lifetime"),
        ("listed = ", "listing = ", "listed"),
        ("KEYS = frozenset(", "PARAMETERS = frozenset(", "KEYS"),
    ],
)
def test_a_dialect_drifting_from_the_protocol_fails_mypy(
    tmp_path: Path, old: str, new: str, missing: str
) -> None:
    source = (FAKE / "dialect.py").read_text()
    assert old in source
    (tmp_path / "broken_dialect.py").write_text(source.replace(old, new))
    (tmp_path / "uses_it.py").write_text(
        "import broken_dialect\n"
        "from backends.fake.dialect import FakeRef, FakeStore\n"
        "from backends.fake.options import Options\n"
        "from provider.core.backend import Dialect\n\n"
        "DIALECT: Dialect[FakeStore, FakeRef, Options] = broken_dialect\n"
    )
    result = mypy(tmp_path, "broken_dialect.py", "uses_it.py")
    assert result.returncode == 1 and "Dialect" in result.stdout and missing in result.stdout, (
        result.stdout
    )


def test_the_registry_refuses_a_dialect_without_a_protocol_member(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dialect = importlib.import_module("backends.fake.dialect")
    monkeypatch.delattr(dialect, "listed")
    monkeypatch.delattr(dialect, "KEYS")
    registry._dialect.cache_clear()
    try:
        with pytest.raises(registry.NotAStore) as refused:
            registry.dialect_module("fake")
    finally:
        registry._dialect.cache_clear()
    assert str(refused.value) == (
        "store 'fake': backends/fake/dialect.py has no 'KEYS', 'listed' "
        "(the Dialect protocol: KEYS, audiences, lifetime, listed, parse)"
    )


def test_the_registry_refuses_a_store_module_whose_dialect_is_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = importlib.import_module("backends.fake.store")
    monkeypatch.setattr(store, "DIALECT", importlib.import_module("backends.vault.dialect"))
    with pytest.raises(
        registry.NotAStore, match=r"store 'fake': backends/fake/store\.py's DIALECT"
    ):
        registry.create(make_env("fake"))
