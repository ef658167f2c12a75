"""Turning one fetched value into the file contents of one object (SPEC §2 Extensions).

Order: parse (only when something needs structure) -> literal key (`secretKey`,
`extractJSONKey`, `extractYAMLKey`) -> JMESPath `extract` -> `explode` into one file per key ->
`decode` (base64/hex) of each resulting file. Strings are written as they are; anything else
as compact JSON (as vault-csi-provider writes non-string values). Bytes stay bytes end to end.
Errors name the object and what to fix, and never quote the secret.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import jmespath
import yaml

from provider.core.errors import BridgeError, InvalidParameters, NotFound
from provider.core.model import ObjectSpec, SecretValue, Transforms
from provider.core.parsing import load_yaml_safe

#: (path relative to the object's name: "" for the object's own file, else a sub-path; bytes)
Piece = tuple[str, bytes]


class _Missing(BridgeError):
    """Internal marker: a missing key is NOT_FOUND, a wrong shape INVALID_ARGUMENT."""


def apply(spec: ObjectSpec, value: SecretValue) -> list[Piece]:
    """The files one value of `spec` becomes (relative sub-paths under the object's name)."""
    t = spec.transforms
    if t.identity:
        return [("", value.content)]
    result: Any = value.content
    if t.extract_key is not None or t.extract is not None or t.explode:
        result = _structured(spec, value)
        if t.extract_key is not None:
            if not isinstance(result, dict) or t.extract_key not in result:
                raise NotFound(
                    f"object {spec.name!r}: key {t.extract_key!r} is not in the secret's data "
                    f"({spec.field or 'the object'}); check the key name"
                )
            result = result[t.extract_key]
        if t.extract is not None:
            result = jmespath.search(t.extract, result)
            if result is None:
                raise NotFound(
                    f"object {spec.name!r}: extract expression {t.extract!r} matched nothing in "
                    "the secret; check the expression (quote keys with '-' or '.')"
                )
    if t.explode:
        if not isinstance(result, dict):
            raise InvalidParameters(
                f"object {spec.name!r}: explode needs a JSON/YAML map, but the value is "
                f"{_kind(result)}"
            )
        pieces = [(str(k), _to_bytes(v)) for k, v in result.items()]
    else:
        pieces = [("", _to_bytes(result))]
    if t.decode is not None:
        pieces = [(sub, _decode(spec, t, data)) for sub, data in pieces]
    return pieces


def _structured(spec: ObjectSpec, value: SecretValue) -> Any:
    if value.data is not None:
        return value.data
    try:
        text = value.content.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidParameters(
            f"object {spec.name!r}: the secret is binary, so keys cannot be extracted from it; "
            "remove the extraction or decode it in a separate object"
        ) from None
    parse_as = spec.transforms.parse_as
    if parse_as in ("json", "any"):
        try:
            return json.loads(text)
        except ValueError:
            if parse_as == "json":
                raise InvalidParameters(
                    f"object {spec.name!r}: the secret is not valid JSON, so a key cannot be "
                    "extracted from it"
                ) from None
    try:
        return load_yaml_safe(text)
    except yaml.YAMLError:
        raise InvalidParameters(
            f"object {spec.name!r}: the secret is neither JSON nor YAML, so a key cannot be "
            "extracted from it"
        ) from None


def _to_bytes(result: Any) -> bytes:
    if isinstance(result, bytes):
        return result
    if isinstance(result, str):
        return result.encode("utf-8")
    return json.dumps(result, separators=(",", ":"), default=str).encode("utf-8")


def _decode(spec: ObjectSpec, t: Transforms, data: bytes) -> bytes:
    try:
        if t.decode == "base64":
            return base64.b64decode(b"".join(data.split()), validate=True)
        return binascii.unhexlify(b"".join(data.split()))
    except (binascii.Error, ValueError):
        raise InvalidParameters(
            f"object {spec.name!r}: the value is not valid {t.decode} ({spec.field or 'decode'}); "
            f"remove the {t.decode} decoding or store the value {t.decode}-encoded"
        ) from None


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str | bytes):
        return "a string"
    return type(value).__name__
