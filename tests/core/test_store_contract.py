"""The store contract is checked by mypy (issue 34): each store's `create` is typed as the
`Backend` protocol and each `store.py` assigns its dialect module to a `Dialect`, so a store
whose backend or dialect drifts from the protocol fails `make lint`. Shown here on broken copies
of the fake store's modules, type-checked with the project's own mypy settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "backends" / "fake"


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
