"""The vault dialect: vault-csi-provider's SecretProviderClass parameters, plus OpenBao's.

    parameters:
      backend: vault
      roleName: app                       # or vaultRoleName / baoRoleName / openbaoRoleName
      vaultAddress: https://vault:8200    # default: --vault-addr / VAULT_ADDR
      vaultAuthMountPath: kubernetes      # or the older vaultKubernetesMountPath
      audience: vault                     # default "openbao" when an OpenBao spelling is used
      objects: |
        - objectName: db-password
          secretPath: secret/data/db?version=2   # a leading v1/ or /v1/ is accepted
          secretKey: password
          method: GET                     # PUT/POST for dynamic secrets, with secretArgs
          secretArgs: {ttl: 1h}
          encoding: base64                # utf-8 (default) | base64 | hex
          filePermission: 0400

Every `vault*` key may also be spelled `bao*` or `openbao*` (the OpenBao provider's names); two
spellings of one key in one class are refused rather than one silently winning, because a pod's
volumeAttributes can add keys to a class.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.base import ObjectSpec, ParseContext, StorePlan, Transforms
from provider.errors import InvalidParameters
from provider.parsing import (
    TRANSFORM_KEYS,
    Problems,
    expect_list,
    expect_map,
    expect_str,
    load_yaml,
    parse_mode,
    parse_transforms,
    unique_names,
)

_PREFIXES = ("vault", "bao", "openbao")
_OPENBAO_PREFIXES = ("bao", "openbao")

#: Canonical setting -> every accepted spelling (the vault* one first, used in messages).
SPELLINGS: dict[str, tuple[str, ...]] = {
    "role": ("roleName", *(p + "RoleName" for p in _PREFIXES)),
    "address": tuple(p + "Address" for p in _PREFIXES),
    "namespace": tuple(p + "Namespace" for p in _PREFIXES),
    "mount": tuple(p + s for s in ("AuthMountPath", "KubernetesMountPath") for p in _PREFIXES),
    "ca_cert": tuple(p + "CACertPath" for p in _PREFIXES),
    "ca_dir": tuple(p + "CADirectory" for p in _PREFIXES),
    "server_name": tuple(p + "TLSServerName" for p in _PREFIXES),
    "client_cert": tuple(p + "TLSClientCertPath" for p in _PREFIXES),
    "client_key": tuple(p + "TLSClientKeyPath" for p in _PREFIXES),
    "skip_verify": tuple(p + "SkipTLSVerify" for p in _PREFIXES),
    "audience": ("audience",),
    "objects": ("objects",),
}
KEYS = frozenset(k for spellings in SPELLINGS.values() for k in spellings)
OBJECT_KEYS = (
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
    )
    | TRANSFORM_KEYS
)
METHODS = ("GET", "PUT", "POST")
DEFAULT_MOUNT = "kubernetes"
# Go's strconv.ParseBool, which vault-csi-provider uses for vaultSkipTLSVerify.
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


@dataclass(frozen=True)
class TLSConfig:
    """How to reach the address over TLS; one HTTP session per (address, TLSConfig)."""

    ca_cert: str = ""
    ca_dir: str = ""
    server_name: str = ""
    client_cert: str = ""
    client_key: str = ""
    skip_verify: bool = False


@dataclass(frozen=True)
class VaultStore:
    """A parsed class's connection and login settings."""

    address: str
    namespace: str
    role: str
    mount: str
    audience: str
    tls: TLSConfig


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


def parse(params: Mapping[str, str], ctx: ParseContext) -> StorePlan:
    problems = Problems()
    values = {name: _one_spelling(params, name, problems) for name in SPELLINGS}
    openbao = any(k.startswith(_OPENBAO_PREFIXES) and params.get(k) for k in params if k in KEYS)
    role = values["role"]
    if not role:
        problems.add(
            "roleName is required: the Vault role to log in as "
            "(also spelled vaultRoleName, baoRoleName, openbaoRoleName)"
        )
    address = values["address"] or _default_address(ctx, problems)
    if address and not address.startswith(("http://", "https://")):
        problems.add(f"vaultAddress: expected an http:// or https:// URL, got {address!r}")
    # Connection settings: the class's value, else the provider's flag (as upstream overlays
    # its flags with the class). Under `check` there are no flags.
    options = ctx.options
    default_skip = bool(getattr(options, "skip_verify", False))
    store = VaultStore(
        address=address.rstrip("/"),
        namespace=_or_option(values, options, "namespace", "namespace").strip("/"),
        role=role,
        mount=values["mount"].strip("/") or DEFAULT_MOUNT,
        audience=values["audience"] or ("openbao" if openbao else "vault"),
        tls=TLSConfig(
            ca_cert=_or_option(values, options, "ca_cert", "ca_cert"),
            ca_dir=_or_option(values, options, "ca_dir", "ca_dir"),
            server_name=_or_option(values, options, "server_name", "tls_server_name"),
            client_cert=_or_option(values, options, "client_cert", "client_cert"),
            client_key=_or_option(values, options, "client_key", "client_key"),
            skip_verify=_go_bool(
                values["skip_verify"], "vaultSkipTLSVerify", problems, default_skip
            ),
        ),
    )
    if bool(store.tls.client_cert) != bool(store.tls.client_key):
        problems.add(
            "vaultTLSClientCertPath and vaultTLSClientKeyPath must be set together "
            "(a client certificate needs its key)"
        )
    specs = _parse_objects(values["objects"], ctx, problems)
    problems.raise_if_any()
    return StorePlan("vault", store, tuple(specs), tuple(problems.warnings))


def _one_spelling(params: Mapping[str, str], name: str, problems: Problems) -> str:
    """The value of a setting given under any of its spellings; two non-empty ones conflict."""
    given = [(k, params[k]) for k in SPELLINGS[name] if params.get(k, "") != ""]
    if len(given) > 1:
        keys = ", ".join(k for k, _ in given)
        problems.add(f"{keys} name the same setting; set only one of them")
    return given[0][1].strip() if given else ""


def _default_address(ctx: ParseContext, problems: Problems) -> str:
    if ctx.offline:
        problems.warn("vaultAddress is not set: the provider's --vault-addr / VAULT_ADDR is used")
        return ""
    addr = getattr(ctx.options, "addr", None) or ""
    if not addr:
        problems.add(
            "vaultAddress is not set and the provider has no default: set vaultAddress in the "
            "SecretProviderClass, or start the provider with --vault-addr (or VAULT_ADDR)"
        )
    return str(addr)


def _or_option(values: Mapping[str, str], options: Any, name: str, option: str) -> str:
    return values[name] or str(getattr(options, option, None) or "")


def _go_bool(value: str, field: str, problems: Problems, default: bool = False) -> bool:
    if value == "":
        return default
    if value in _GO_FALSE:
        return False
    if value in _GO_TRUE:
        return True
    problems.add(f'{field}: expected "true" or "false", got {value!r}')
    return False


def _parse_objects(raw: str, ctx: ParseContext, problems: Problems) -> list[ObjectSpec]:
    if not raw.strip():
        problems.add("objects is required: a YAML list of {objectName, secretPath, ...}")
        return []
    try:
        entries = expect_list(load_yaml(raw, "objects"), "objects", problems)
    except InvalidParameters as exc:  # keep collecting the other parameters' problems
        problems.items.extend(exc.problems)
        return []
    if len(entries) > ctx.max_objects:
        problems.add(f"objects: {len(entries)} objects is over the limit of {ctx.max_objects}")
        return []
    specs = [spec for i, e in enumerate(entries) if (spec := _parse_object(e, i, problems))]
    unique_names([(s.name, s.field) for s in specs], "objectName", problems)
    return specs


def _parse_object(entry: Any, i: int, problems: Problems) -> ObjectSpec | None:
    where = f"objects[{i}]"
    obj = expect_map(entry, where, problems)
    if obj is None:
        return None
    for key in sorted(set(obj) - OBJECT_KEYS, key=str):
        problems.add(f"{where}.{key} is not a vault object parameter")
    name = expect_str(obj.get("objectName"), f"{where}.objectName", problems, required=True)
    ref = _parse_ref(obj, where, problems)
    key = expect_str(obj.get("secretKey"), f"{where}.secretKey", problems)
    encoding = expect_str(obj.get("encoding"), f"{where}.encoding", problems).lower()
    if encoding not in ("", "utf-8", "utf8", "base64", "hex"):
        problems.add(f"{where}.encoding: expected utf-8, base64 or hex, got {encoding!r}")
    decode: Any = encoding if encoding in ("base64", "hex") else None
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
    if not path or parsed.scheme or parsed.netloc or ".." in path.split("/"):
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
