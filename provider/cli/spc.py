"""Reading SecretProviderClass manifests (for `check` and `mount`), as the API server would
accept them: `spec.parameters` is a map of strings."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import yaml

from provider.core.boundedyaml import UniqueKeyLoader, yaml_problem
from provider.core.errors import InvalidParameters

PROVIDER_NAME = "secrets-bridge"


@dataclass(frozen=True)
class SecretProviderClass:
    name: str
    namespace: str
    provider: str
    parameters: dict[str, str]


def load(path: str) -> list[SecretProviderClass]:
    """Every SecretProviderClass in a (multi-document) YAML file; `-` is standard input."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        raise InvalidParameters(f"cannot read the file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InvalidParameters("cannot read the file (not UTF-8 text)") from None
    try:
        # Not bounded (an operator's own file, perhaps a List of every class), but a key
        # given twice is refused, as the API server refuses it.
        docs = [d for d in yaml.load_all(text, Loader=UniqueKeyLoader) if d is not None]
    except yaml.YAMLError as exc:
        raise InvalidParameters(f"not valid YAML: {yaml_problem(exc)}") from None
    # `kubectl get secretproviderclasses -A -o yaml` prints one List of them.
    items = [
        item
        for d in docs
        for item in (
            d.get("items") or [] if isinstance(d, dict) and d.get("kind") == "List" else [d]
        )
    ]
    classes = [
        _parse(d, path)
        for d in items
        if isinstance(d, dict) and d.get("kind") == "SecretProviderClass"
    ]
    if not classes:
        raise InvalidParameters("no object of kind SecretProviderClass in the file")
    return classes


def _parse(doc: dict[str, object], path: str) -> SecretProviderClass:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    spec = doc.get("spec")
    assert isinstance(meta, dict)
    name = str(meta.get("name", ""))
    where = f"SecretProviderClass {name or '(unnamed)'}"
    if not isinstance(spec, dict):
        raise InvalidParameters(f"{where}: spec is missing")
    params = spec.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidParameters(f"{where}: spec.parameters must be a map of strings")
    bad = [_not_a_string(str(k), v) for k, v in params.items() if not isinstance(v, str)]
    if bad:
        raise InvalidParameters(
            f"{where}: class parameters are strings (the API server refuses anything else): "
            + "; ".join(bad)
        )
    return SecretProviderClass(
        name=name,
        namespace=str(meta.get("namespace", "default")),
        provider=str(spec.get("provider", "")),
        parameters={str(k): v for k, v in params.items()},
    )


def _not_a_string(key: str, value: object) -> str:
    """How to write one parameter that YAML did not read as a string: quoted, or as a block."""
    if isinstance(value, dict | list):
        kind = "map" if isinstance(value, dict) else "list"
        return f"{key} is a YAML {kind}: write it as a block, '{key}: |' with the YAML below it"
    if value is None:
        return f'{key} is empty: write {key}: ""'
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    kind = "true/false" if isinstance(value, bool) else "a number"
    return f'{key} is {kind}, not a string: quote it, {key}: "{shown}"'
