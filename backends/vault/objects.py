"""The objects of a vault class: each entry's request (path, query, method, body) and what
becomes of its answer (secretKey, encoding, our extension keys).

    - objectName: db-password             # file name, unique
      secretPath: secret/data/db?version=2 # API path; a leading v1/ or /v1/ is accepted
      secretKey: password                 # a top-level key of the data (KV v2: data.data)
      method: POST                        # GET (default) | PUT | POST, for dynamic secrets
      secretArgs: {ttl: 1h}               # the JSON body
      encoding: base64                    # utf-8 (default) | base64 | hex
      filePermission: 0400                # a YAML integer
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from provider.core.model import ObjectSpec, Transforms, hashed_once
from provider.core.parsing import (
    ObjectList,
    Problems,
    expect_map,
    expect_str,
    parse_mode,
    parse_transforms,
)

if TYPE_CHECKING:
    from backends.vault.selectors import VaultSelection

OBJECTS = ObjectList(
    "a vault object",
    frozenset(
        {
            "objectName",
            "secretPath",
            "secretKey",
            "method",
            "secretArgs",
            "encoding",
            "filePermission",
        }
    ),
    "objects is required: a YAML list of {objectName, secretPath, ...}",
)
METHODS = ("GET", "PUT", "POST")


@hashed_once
@dataclass(frozen=True)
class VaultRef:
    """One request to Vault. Equal refs are one read, so a dynamic credential's fields share a
    lease: path (no query), the query pairs, the method and the body as canonical JSON text."""

    path: str
    method: str = "GET"
    query: tuple[tuple[str, str], ...] = ()
    body: str = ""

    def describe(self) -> str:
        query = ("?" + urllib.parse.urlencode(self.query)) if self.query else ""
        return f"{self.method} {self.path}{query}"


def parse_object(
    obj: Mapping[str, Any], where: str, problems: Problems
) -> ObjectSpec[VaultRef | VaultSelection] | None:
    """One entry of `objects` (a map of known keys: parse_objects checked them)."""
    name = expect_str(obj.get("objectName"), f"{where}.objectName", problems, required=True)
    ref = _parse_ref(obj, where, problems)
    key = expect_str(obj.get("secretKey"), f"{where}.secretKey", problems)
    encoding = expect_str(obj.get("encoding"), f"{where}.encoding", problems).lower()
    if encoding not in ("", "utf-8", "utf8", "base64", "hex"):
        problems.add(f"{where}.encoding: expected utf-8, base64 or hex, got {encoding!r}")
    # Upstream applies `encoding` only to a secretKey's value (provider.go), never to the
    # whole JSON response.
    decode: Any = encoding if key and encoding in ("base64", "hex") else None
    base = Transforms(extract_key=key or None, parse_as="json", decode=decode)
    transforms = parse_transforms(obj, where, problems, base=base)
    mode = parse_mode(obj.get("filePermission"), f"{where}.filePermission", problems)
    if not name or ref is None:
        return None
    return ObjectSpec(name, ref, mode, transforms, f"{where}.objectName")


def _parse_ref(obj: Mapping[str, Any], where: str, problems: Problems) -> VaultRef | None:
    raw_path = expect_str(obj.get("secretPath"), f"{where}.secretPath", problems, required=True)
    method = expect_str(obj.get("method"), f"{where}.method", problems).upper() or "GET"
    if method not in METHODS:
        problems.add(f"{where}.method: expected GET, PUT or POST, got {method!r}")
    body = ""
    if obj.get("secretArgs") not in (None, ""):
        args = expect_map(obj.get("secretArgs"), f"{where}.secretArgs", problems)
        if args is not None:
            body = json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)
            if method == "GET":
                problems.warn(
                    f"{where}.secretArgs is sent as the request body, which Vault ignores for "
                    "GET; set method: POST or PUT for a dynamic secret"
                )
    if not raw_path:
        return None
    parsed = urllib.parse.urlsplit(raw_path.strip())
    path = parsed.path.lstrip("/")
    # Upstream accepts the API prefix too: "v1/secret/x" and "/v1/secret/x" mean "secret/x".
    path = path.removeprefix("v1/").strip("/")
    # Dot segments, escaped or not: the HTTP client resolves `%2e%2e` as `..`, so the read
    # would go elsewhere than the path the audit trail and the messages name.
    segments = urllib.parse.unquote(path).split("/")
    if not path or parsed.scheme or parsed.netloc or {".", ".."} & set(segments):
        problems.add(
            f"{where}.secretPath: expected an API path without /v1/, such as "
            f"secret/data/db, got {raw_path!r}"
        )
        return None
    try:
        query = urllib.parse.parse_qsl(parsed.query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        problems.add(f"{where}.secretPath: malformed query string in {raw_path!r}")
        return None
    for k, v in query:
        if k == "version" and not v.isdigit():
            problems.add(f"{where}.secretPath: ?version= expects a number, got {v!r}")
    return VaultRef(path=path, method=method, query=tuple(sorted(query)), body=body)
