"""Reading SecretProviderClass manifests (for `check` and `mount`), as the API server would
accept them: `spec.parameters` is a map of strings."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from provider.core.errors import InvalidParameters

PROVIDER_NAME = "secrets-bridge"


@dataclass(frozen=True)
class SecretProviderClass:
    name: str
    namespace: str
    provider: str
    parameters: dict[str, str]


def load(path: str) -> list[SecretProviderClass]:
    """Every SecretProviderClass in a (multi-document) YAML file."""
    try:
        with open(path, encoding="utf-8") as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d is not None]
    except OSError as exc:
        raise InvalidParameters(f"{path}: cannot read the file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise InvalidParameters(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    classes = [
        _parse(d, path)
        for d in docs
        if isinstance(d, dict) and d.get("kind") == "SecretProviderClass"
    ]
    if not classes:
        raise InvalidParameters(f"{path}: no object of kind SecretProviderClass in the file")
    return classes


def _parse(doc: dict[str, object], path: str) -> SecretProviderClass:
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    spec = doc.get("spec")
    assert isinstance(meta, dict)
    name = str(meta.get("name", ""))
    where = f"{path}: SecretProviderClass {name or '(unnamed)'}"
    if not isinstance(spec, dict):
        raise InvalidParameters(f"{where}: spec is missing")
    params = spec.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidParameters(f"{where}: spec.parameters must be a map of strings")
    bad = sorted(str(k) for k, v in params.items() if not isinstance(v, str))
    if bad:
        raise InvalidParameters(
            f"{where}: spec.parameters values must be strings (quote them, or use '|' for YAML "
            f"blocks); not strings: {', '.join(bad)}"
        )
    return SecretProviderClass(
        name=name,
        namespace=str(meta.get("namespace", "default")),
        provider=str(spec.get("provider", "")),
        parameters={str(k): v for k, v in params.items()},
    )
