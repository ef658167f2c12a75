"""The objects of an Azure class: `objects` as the upstream `array:` of YAML strings.

Each entry becomes an ObjectSpec whose `ref` is an AzureRef (what to read). `objectEncoding` alone
is part of the ref: the backend decodes the secret it read, so the file keeps Key Vault's version
id as its object version, as upstream reports it (the core would answer an HMAC for a file its
transforms changed). With our `extract`/`explode` it becomes the core's `decode` transform
instead, decoding the extracted bytes after any extraction (docs/compatibility.md).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from provider.core.boundedyaml import load_yaml
from provider.core.model import ObjectSpec, ParseContext, Transforms, hashed_once
from provider.core.parsing import (
    ObjectList,
    Problems,
    expect_str,
    object_entries,
    parse_mode,
    parse_transforms,
)

#: The entries of `objects.array`; upstream object keys of other provider versions that we do
#: not implement are refused by name.
OBJECTS = ObjectList(
    "an Azure Key Vault object",
    frozenset(
        {
            "objectName",
            "objectAlias",
            "objectType",
            "objectVersion",
            "objectVersionHistory",
            "objectFormat",
            "objectEncoding",
            "filePermission",
        }
    ),
    refused={
        "objectNotAfter": "selecting a version by expiry is not supported; use objectVersion",
    },
    unique="file name (objectAlias or objectName)",
    empty="objects.array is empty: list at least one object",
)

ObjectType = Literal["secret", "key", "cert"]

# Object names in Key Vault: 1-127 letters, digits and hyphens; versions are 32 hex digits, but
# we only refuse what cannot be a URL path segment, so a store-side rule change needs no release.
_OBJECT_NAME = re.compile(r"^[-A-Za-z0-9]{1,127}$")
# Upstream passes any objectVersion through (its tests use "version-id"); only what could not
# be one URL path segment is refused.
_VERSION = re.compile(r"^[A-Za-z0-9._~-]{1,256}$")
MAX_VERSION_HISTORY = 100


@hashed_once
@dataclass(frozen=True)
class AzureRef:
    """One read: an object of a type, at a version (or the latest), possibly with history."""

    object_type: ObjectType
    name: str
    version: str = ""
    #: Versions to write (files `<alias>/0..N-1`); 0 means a single file.
    history: int = 0
    #: objectFormat pfx: a certificate's secret as the base64 PFX Key Vault stores.
    pfx: bool = False
    #: objectEncoding (base64, hex) without other transforms: decoded by the backend.
    encoding: Literal["base64", "hex"] | None = None

    def describe(self) -> str:
        """`<type>/<name>[/<version>]`, as Key Vault names the object."""
        name = f"{self.object_type}/{self.name}" + (f"/{self.version}" if self.version else "")
        return name + (f" (history {self.history})" if self.history else "")


def parse_objects(
    raw: str, ctx: ParseContext[Any], problems: Problems
) -> list[ObjectSpec[AzureRef]]:
    """The class's objects; none at all only when the class selects (`select`)."""
    if not raw.strip():
        if not ctx.selects:
            problems.add(
                "objects is required: a YAML map with `array:`, a list of object strings "
                "(or `select`, selectors of secrets by name prefix and tags)"
            )
        return []
    doc = load_yaml(raw, "objects")
    if not isinstance(doc, dict) or "array" not in doc:
        problems.add("objects: expected a YAML map with an `array:` list of object strings")
        return []
    entry = functools.partial(_parse_object, problems=problems)
    return object_entries(doc["array"], "objects.array", OBJECTS, entry, ctx, problems, _object_map)


def _object_map(entry: Any, where: str, problems: Problems) -> Mapping[str, Any] | None:
    # Upstream each entry is a YAML string holding a map; a map written inline is accepted too.
    obj = load_yaml(entry, where) if isinstance(entry, str) else entry
    if not isinstance(obj, dict):
        problems.add(f"{where}: expected a YAML string holding a map of object keys")
        return None
    # Upstream's formatKeyVaultObject trims every string field.
    return {k: v.strip() if isinstance(v, str) else v for k, v in obj.items()}


def _parse_object(obj: Mapping[str, Any], where: str, problems: Problems) -> ObjectSpec[AzureRef]:
    name = expect_str(obj.get("objectName"), f"{where}.objectName", problems, required=True)
    if name and not _OBJECT_NAME.match(name):
        problems.add(f"{where}.objectName {name!r}: Key Vault names are letters, digits and '-'")
    kind = expect_str(obj.get("objectType"), f"{where}.objectType", problems).strip().lower()
    if kind not in ("secret", "key", "cert"):
        problems.add(f"{where}.objectType: expected secret, key or cert, got {kind or 'nothing'!r}")
        kind = "secret"
    version = expect_str(obj.get("objectVersion"), f"{where}.objectVersion", problems).strip()
    if version.lower() == "latest":
        version = ""  # upstream's word for the newest version
    if version and not _VERSION.match(version):
        problems.add(f"{where}.objectVersion {version!r} is not a Key Vault version id")
    history = _history(obj.get("objectVersionHistory"), f"{where}.objectVersionHistory", problems)
    pfx = _format(obj.get("objectFormat"), kind, where, problems)
    decode = _encoding(obj.get("objectEncoding"), kind, where, problems)
    alias = expect_str(obj.get("objectAlias"), f"{where}.objectAlias", problems).strip()
    mode = parse_mode(obj.get("filePermission"), f"{where}.filePermission", problems)
    transforms = parse_transforms(obj, where, problems, base=Transforms(decode=decode))
    encoding = None
    if decode is not None and obj.get("decode") is None:
        rest = replace(transforms, decode=None)
        if rest.identity:
            # The file is then Key Vault's value, decoded as upstream does: the backend decodes
            # it, and the object version stays the vault's version id (upstream's).
            encoding, transforms = decode, rest
    ref = AzureRef(kind, name, version, history, pfx, encoding)  # type: ignore[arg-type]
    field = f"{where}.objectAlias" if alias else f"{where}.objectName"
    # Upstream's ObjectVersion id (GetObjectUID); a history's values carry `<type>/<name>/<i>`.
    version_id = f"{kind}/{name}"
    return ObjectSpec(alias or name, ref, mode, transforms, field, version_id=version_id)


def _history(value: Any, field: str, problems: Problems) -> int:
    if value is None or value == "":
        return 0
    try:
        count = int(str(value).strip())
    except ValueError:
        problems.add(f"{field}: expected a number of versions, got {value!r}")
        return 0
    if count < 0 or count > MAX_VERSION_HISTORY:
        problems.add(f"{field}: expected 0..{MAX_VERSION_HISTORY} versions, got {count}")
        return 0
    # 0 and 1 both mean "one version, one file" upstream (no <alias>/0 directory).
    return count if count > 1 else 0


def _format(value: Any, kind: str, where: str, problems: Problems) -> bool:
    fmt = expect_str(value, f"{where}.objectFormat", problems).strip().lower()
    if fmt not in ("", "pem", "pfx"):
        problems.add(f"{where}.objectFormat: expected pem or pfx, got {fmt!r}")
        return False
    if fmt == "pfx" and kind != "secret":
        problems.add(
            f"{where}.objectFormat pfx needs objectType secret (the certificate's private part "
            f"is a secret in Key Vault), got objectType {kind}"
        )
    return fmt == "pfx"


def _encoding(
    value: Any, kind: str, where: str, problems: Problems
) -> Literal["base64", "hex"] | None:
    enc = expect_str(value, f"{where}.objectEncoding", problems).strip().lower()
    if not enc:
        return None
    if enc not in ("utf-8", "hex", "base64"):
        problems.add(f"{where}.objectEncoding: expected utf-8, hex or base64, got {enc!r}")
        return None
    if kind != "secret":
        problems.add(f"{where}.objectEncoding is only supported for objectType secret, not {kind}")
        return None
    return None if enc == "utf-8" else enc  # type: ignore[return-value]
