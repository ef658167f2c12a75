"""Rendered manifests for the deployment tests: `kubectl kustomize` over a copy of deploy/.

The copy gets a fresh random HMAC key, because the repository deliberately has none
(deploy/base/hmac.key is generated per cluster). Rendering happens once per session.
A missing tool fails the tests with the command that installs it; nothing is skipped.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAY = "overlays/token-request-fallback"
KEY_FILE = "base/hmac.key"


def tool(path: str | None, name: str, install: str) -> str:
    """The tool's path, or a test failure that says how to install it."""
    if path is None or not Path(path).exists():
        pytest.fail(f"{name} is missing ({path or 'not on PATH'}): {install}", pytrace=False)
    return path


def kubectl() -> str:
    return tool(
        shutil.which("kubectl"),
        "kubectl",
        "it comes with the machine image (/usr/bin/kubectl); install kubectl >= 1.27 for "
        "`kubectl kustomize`",
    )


def copy_deploy(dest: Path, *, with_key: bool) -> Path:
    """deploy/ copied to dest, with a random HMAC key or with none at all."""
    target = dest / "deploy"
    shutil.copytree(DEPLOY, target, ignore=shutil.ignore_patterns("hmac.key"))
    if with_key:
        (target / KEY_FILE).write_text(secrets.token_urlsafe(48))
    return target


def kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@dataclass(frozen=True)
class Rendered:
    """One `kubectl kustomize` output: its text and its documents."""

    text: str
    docs: list[dict[str, Any]]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.all(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        return found[0]


def render(directory: Path) -> Rendered:
    result = kustomize(directory)
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    return Rendered(text=result.stdout, docs=docs)


@pytest.fixture(scope="session")
def deploy_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_deploy(tmp_path_factory.mktemp("deploy"), with_key=True)


@pytest.fixture(scope="session")
def base(deploy_copy: Path) -> Rendered:
    return render(deploy_copy)


@pytest.fixture(scope="session")
def overlay(deploy_copy: Path) -> Rendered:
    return render(deploy_copy / OVERLAY)
