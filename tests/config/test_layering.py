"""Layering contracts (as kopf keeps with import-linter): only the gRPC edge touches the stubs;
backends never import the server, the composition root, or each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STORES = ("vault", "aws", "gcp", "azure", "fake")
# Modules that may import the generated stubs: the edge, and the tools that play the driver.
GRPC_EDGE = {
    "provider/server.py",
    "provider/echo.py",
    "provider/driver.py",
    "provider/bench.py",
    "provider/demo.py",
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", modules("backends"), ids=lambda p: str(p.relative_to(ROOT)))
def test_backends_stay_behind_the_interface(path: Path) -> None:
    rel = path.relative_to(ROOT)
    own = rel.parts[1] if len(rel.parts) > 2 else None
    for name in imports(path):
        assert not name.startswith(
            (
                "protos",
                "grpc_tools",
                "provider.server",
                "provider.app",
                "provider.cli",
                "provider.mounting",
            )
        ), (rel, name)
        if name.startswith("backends.") and name.split(".")[1] in STORES:
            assert name.split(".")[1] == own, f"{rel} imports another backend: {name}"


@pytest.mark.parametrize("path", modules("provider"), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_edge_touches_the_generated_stubs(path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    if rel in GRPC_EDGE:
        return
    assert not any(n.startswith("protos") for n in imports(path)), rel
    # The core never imports a store's SDK: backends are loaded by name, on first use.
    sdks = ("hvac", "aiobotocore", "botocore", "google.cloud", "azure")
    assert not any(n.startswith(sdks) for n in imports(path)), rel
