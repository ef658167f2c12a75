"""deploy/examples: each SecretProviderClass passes our own `secrets-bridge check`, one per
backend (`<store>.yaml`, every store the registry lists but the test store) plus one using the
extensions, and the Pod mounts one through an inline CSI volume."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from backends import registry
from tests.deploy.conftest import DEPLOY, ROOT, tool

EXAMPLES = DEPLOY / "examples"
CLI = ROOT / ".venv" / "bin" / "secrets-bridge"
#: Stores without an example: the fake store is for tests and demos (docs/fake-store.md).
NO_EXAMPLE = {"fake"}
#: (example, its store): one class per store, in its upstream provider's style.
PER_STORE = [(f"{name}.yaml", name) for name in registry.names() if name not in NO_EXAMPLE]
#: Worked examples of one feature each, beside each store's own.
FEATURES = [
    "aws-cross-account.yaml",
    "aws-select.yaml",
    "azure-identity-binding.yaml",
    "azure-select.yaml",
    "gcp-select.yaml",
    "vault-aws-auth.yaml",
    "vault-azure-auth.yaml",
    "vault-gcp-auth.yaml",
    "vault-select.yaml",
]
CLASSES = [*(example for example, _ in PER_STORE), "extensions.yaml", *FEATURES]


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def spc(name: str) -> dict[str, Any]:
    (doc,) = load(name)
    assert doc["kind"] == "SecretProviderClass"
    return doc


def test_examples_are_the_classes_and_the_pod() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted([*CLASSES, "pod.yaml"])


@pytest.mark.parametrize("name", CLASSES)
def test_secrets_bridge_check_accepts_the_example(name: str) -> None:
    cli = tool(str(CLI), "secrets-bridge", "run `make install` (pip install -e '.[test]')")
    result = subprocess.run(
        [cli, "check", str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("name", "backend"), PER_STORE)
def test_one_class_per_backend_in_the_upstream_style(name: str, backend: str) -> None:
    doc = spc(name)
    assert doc["apiVersion"] == "secrets-store.csi.x-k8s.io/v1"
    assert doc["spec"]["provider"] == "secrets-bridge"
    params = doc["spec"]["parameters"]
    assert params["backend"] == backend
    # The driver hands parameters over as strings: object lists are YAML inside a string.
    assert all(isinstance(v, str) for v in params.values()), params
    # The parameter that lists the objects, as the dialect names it (its `listed`).
    (key,) = registry.dialect_module(backend).listed([])
    listing = yaml.safe_load(params[key])
    assert listing, f"{name} fetches nothing"


def test_extensions_example_uses_extract_and_both_kinds_of_template() -> None:
    params = spc("extensions.yaml")["spec"]["parameters"]
    assert all(isinstance(v, str) for v in params.values()), params
    objects = yaml.safe_load(params["objects"])
    assert any("extract" in o for o in objects)
    templates = yaml.safe_load(params["templates"])
    assert any(t.get("format") == "env" for t in templates)
    assert any("template" in t for t in templates)


def test_pod_mounts_an_example_class_through_a_read_only_inline_csi_volume() -> None:
    docs = load("pod.yaml")
    version = kubernetes_validate.latest_version()
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    (volume,) = [v for v in pod["spec"]["volumes"] if "csi" in v]
    csi = volume["csi"]
    assert csi["driver"] == "secrets-store.csi.k8s.io"
    assert csi["readOnly"] is True
    names = {spc(n)["metadata"]["name"] for n in CLASSES}
    assert csi["volumeAttributes"]["secretProviderClass"] in names
    (mount,) = [
        m
        for c in pod["spec"]["containers"]
        for m in c["volumeMounts"]
        if m["name"] == volume["name"]
    ]
    assert mount["readOnly"] is True


def test_examples_are_not_installed_by_the_base() -> None:
    kustomizations = DEPLOY.glob("**/kustomization.yaml")
    referenced = [
        r for k in kustomizations for r in (yaml.safe_load(k.read_text()).get("resources") or [])
    ]
    assert not [r for r in referenced if "examples" in Path(r).parts]
