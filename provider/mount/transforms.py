"""Turning one fetched value into the file contents of one object (docs/architecture.md).

Order: parse (only when something needs structure) -> literal key (`secretKey`,
`extractJSONKey`, `extractYAMLKey`) -> JMESPath `extract` -> `explode` into one file per key ->
`decode` (base64/hex) of each resulting file. Strings are written as they are; anything else
as compact JSON (as vault-csi-provider writes non-string values). Bytes stay bytes end to end.

The class and the secret are both the tenant's, and one provider serves every namespace, so
each step runs under a budget: `limit` bytes of output (what is left of the mount's
--max-response-bytes), checked before anything larger is built, and a step budget for JMESPath
(provider/mount/jmes.py).
Errors name the object and the expression and never quote the secret: a library's exception
text (jmespath, yaml, json, binascii) may carry the value, so it never reaches a message or log.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, TypeVar

from jmespath.exceptions import JMESPathError, JMESPathTypeError

from provider.core.boundedyaml import MAX_YAML_BYTES, load_yaml_safe
from provider.core.errors import BridgeError, InvalidParameters, LimitExceeded, NotFound
from provider.core.model import DataAt, ObjectSpec, SecretValue, Transforms
from provider.core.parsing import shown
from provider.mount import jmes

#: (path relative to the object's name: "" for the object's own file, else a sub-path; bytes)
Piece = tuple[str, bytes]
_Sized = TypeVar("_Sized", str, bytes)

#: Files one `explode` may yield.
MAX_EXPLODE_FILES = 1000
#: Values (roughly: `,` `[` `{` and newlines) a secret may hold to be parsed for extraction;
#: parsed JSON's memory grows with them (measured: BENCHMARKS.md, "Values parsed for
#: extraction").
MAX_SECRET_VALUES = 200_000


def apply(
    spec: ObjectSpec[Any],
    value: SecretValue,
    limit: int,
    *,
    work: int | None = None,
    parsed: dict[Any, Any] | None = None,
) -> list[Piece]:
    """The files one value of `spec` becomes (relative sub-paths under the object's name), at
    most `limit` bytes of content in all. `work` bounds any intermediate value of `extract`
    (default `limit`); `parsed` keeps each value's parsed form for the other objects of the
    mount that read the same value (AWS writes a secret and each of its jmesPath results)."""
    try:
        return _apply(spec, value, _Limits(limit, work or limit, {} if parsed is None else parsed))
    except BridgeError as exc:
        # A mount keeps every object's error; a traceback (or a chained internal exception)
        # would keep the failed step's locals, such as an oversized result, alive with it.
        exc.__context__ = exc.__cause__ = None
        raise exc.with_traceback(None) from None
    except Exception as exc:
        # Anything a library raised on the tenant's value: its text may quote the value.
        raise InvalidParameters(
            f"object {spec.name!r}: transforming the secret failed ({type(exc).__name__}); "
            "the value is not shown; check the object's extract/explode/decode settings"
        ) from None


@dataclass(frozen=True)
class _Limits:
    output: int
    work: int
    parsed: dict[Any, Any]


def _apply(spec: ObjectSpec[Any], value: SecretValue, limits: _Limits) -> list[Piece]:
    limit = limits.output
    t = spec.transforms
    if t.identity:
        return [("", _within(spec, value.content, limit, "the secret"))]
    result: Any = value.content
    if t.extract_key is not None or t.extract is not None or t.explode:
        result = _parsed(spec, value, limits.parsed)
        if t.extract_key is not None:
            if not isinstance(result, dict) or t.extract_key not in result:
                raise NotFound(
                    f"object {spec.name!r}: key {t.extract_key!r} is not in the secret's data "
                    f"({spec.field or 'the object'}); check the key name"
                )
            result = result[t.extract_key]
        if t.extract is not None:
            result = _search(spec, t.extract, result, limits)
    pieces = _explode(spec, result, limit) if t.explode else [("", _to_bytes(spec, result, limit))]
    if t.decode is not None:
        pieces = [(sub, _decode(spec, t, data)) for sub, data in pieces]
    return pieces


def _parsed(spec: ObjectSpec[Any], value: SecretValue, parsed: dict[Any, Any]) -> Any:
    """Parse each value once per mount: 100 objects reading one YAML value would otherwise
    each pay for the parse. (Failures are not kept: the mount's YAML budget bounds retries.)"""
    key = (id(value), spec.transforms.parse_as)
    held = parsed.get(key)
    if held is not None and held[0] is value:
        return held[1]
    result = _structured(spec, value)
    parsed[key] = (value, result)
    return result


def _structured(spec: ObjectSpec[Any], value: SecretValue) -> Any:
    if isinstance(value.data, DataAt):
        return _data_at(spec, value)
    if value.data is not None:
        return value.data
    content = value.content
    values = sum(content.count(c) for c in (b",", b"[", b"{", b"\n"))
    if values > MAX_SECRET_VALUES:
        raise LimitExceeded(
            f"object {spec.name!r}: the secret holds about {values} values, over the limit of "
            f"{MAX_SECRET_VALUES} for extraction; extract from a smaller secret"
        )
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidParameters(
            f"object {spec.name!r}: the secret is binary, so keys cannot be extracted from it; "
            "remove the extraction or decode it in a separate object"
        ) from None
    parse_as = spec.transforms.parse_as
    if parse_as in ("json", "any"):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            if parse_as == "json":
                raise InvalidParameters(
                    f"object {spec.name!r}: the secret is not valid JSON, so a key cannot be "
                    "extracted from it"
                ) from None
    return _yaml(spec, text)


def _data_at(spec: ObjectSpec[Any], value: SecretValue) -> Any:
    """The store's structured view of a JSON answer (Vault's data map), as its store used to
    hand it over parsed: the whole answer was parsed when read, so the values limit does not
    apply (it did not before)."""
    try:
        return value.view()
    except (ValueError, RecursionError):
        raise InvalidParameters(
            f"object {spec.name!r}: the secret is not valid JSON, so a key cannot be "
            "extracted from it"
        ) from None


def _yaml(spec: ObjectSpec[Any], text: str) -> Any:
    # PyYAML is pure Python (measured: BENCHMARKS.md, "The YAML parser's cost per node"): only
    # small documents, under the node limit.
    if len(text) > MAX_YAML_BYTES:
        raise InvalidParameters(
            f"object {spec.name!r}: the secret is not JSON and is over {MAX_YAML_BYTES} bytes, "
            "the limit for YAML; store it as JSON to extract from it"
        )
    try:
        return load_yaml_safe(text)
    except Exception:
        raise InvalidParameters(
            f"object {spec.name!r}: the secret is neither JSON nor YAML (or is YAML with "
            "aliases, deeper than 32 levels or over 10000 values), so a key cannot be "
            "extracted from it"
        ) from None


def _search(spec: ObjectSpec[Any], expression: str, data: Any, limits: _Limits) -> Any:
    limit = limits.work
    try:
        result = jmes.search(expression, data, limit)
    except jmes.OverBudget as over:
        if over.steps:
            raise LimitExceeded(
                f"object {spec.name!r}: extract expression {shown(expression)} needs more "
                f"than {jmes.MAX_STEPS} evaluation steps on this secret; simplify it"
            ) from None
        raise _too_big(spec, f"extract expression {shown(expression)}", limit) from None
    except (JMESPathError, RecursionError, TypeError, ValueError, ArithmeticError) as exc:
        raise InvalidParameters(
            f"object {spec.name!r}: extract expression {shown(expression)} failed on the "
            f"secret ({_reason(exc)}); the value is not shown; check the expression against "
            "the secret's shape"
        ) from None
    if result is None:
        raise NotFound(
            f"object {spec.name!r}: extract expression {shown(expression)} matched nothing in "
            "the secret; check the expression (quote keys with '-' or '.')"
        )
    return result


def _reason(exc: Exception) -> str:
    """What went wrong, from types only (the exception's own text may quote the value)."""
    if isinstance(exc, JMESPathTypeError):
        expected = " or ".join(str(t) for t in exc.expected_types)
        return f"{exc.function_name}() expected {expected}, got {exc.actual_type}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return type(exc).__name__


def _explode(spec: ObjectSpec[Any], result: Any, limit: int) -> list[Piece]:
    if not isinstance(result, dict):
        raise InvalidParameters(
            f"object {spec.name!r}: explode needs a JSON/YAML map, but the value is {_kind(result)}"
        )
    if len(result) > MAX_EXPLODE_FILES:
        raise LimitExceeded(
            f"object {spec.name!r}: explode would write {len(result)} files, over the limit "
            f"of {MAX_EXPLODE_FILES} for one object; extract a smaller map first"
        )
    pieces = []
    left = limit
    for key, item in result.items():
        data = _to_bytes(spec, item, left)
        left -= len(data)
        pieces.append((str(key), data))
    return pieces


def _to_bytes(spec: ObjectSpec[Any], result: Any, limit: int) -> bytes:
    if isinstance(result, bytes):
        data = result
    elif isinstance(result, str):
        # A character is at least one byte: refuse before encoding.
        _within(spec, result, limit, "the extracted value")
        data = result.encode("utf-8")
    else:
        # Containers built by `extract` were sized while built, and anything else is part of
        # the parsed secret: JSON of either is at most a few times the budget or the secret.
        data = json.dumps(result, separators=(",", ":"), default=str).encode("utf-8")
    return _within(spec, data, limit, "the extracted value")


def _within(spec: ObjectSpec[Any], data: _Sized, limit: int, what: str) -> _Sized:
    if len(data) > limit:
        raise _too_big(spec, what, limit)
    return data


def _too_big(spec: ObjectSpec[Any], what: str, limit: int) -> LimitExceeded:
    return LimitExceeded(
        f"object {spec.name!r}: {what} would produce more than {limit} bytes, the part of the "
        "mount's --max-response-bytes budget left for it; shrink the output or raise the limit"
    )


def _decode(spec: ObjectSpec[Any], t: Transforms, data: bytes) -> bytes:
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
