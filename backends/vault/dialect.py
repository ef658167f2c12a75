"""The vault dialect: vault-csi-provider's SecretProviderClass parameters, plus OpenBao's.

    parameters:
      backend: vault
      roleName: app                       # or vaultRoleName / baoRoleName / openbaoRoleName
      vaultAddress: https://vault:8200    # default: --vault-addr / VAULT_ADDR
      vaultAuthMountPath: kubernetes      # or the older vaultKubernetesMountPath
      audience: vault                     # default "openbao" when an OpenBao spelling is used
      vaultAuthType: kubernetes           # or jwt, aws, gcp, azure: see backends/vault/methods.py
      objects: |                          # see backends/vault/objects.py
        - {objectName: db-password, secretPath: secret/data/db, secretKey: password}
      select: |                           # optional: see backends/vault/selectors.py
        - {path: secret/app, recursive: true, directory: app}

Every `vault*` key may also be spelled `bao*` or `openbao*` (the OpenBao provider's names); two
spellings of one key in one class are refused rather than one silently winning, because a pod's
volumeAttributes can add keys to a class.

A class's `vaultAddress` is `http(s)://host[:port]` with an optional path prefix (a reverse
proxy's): the client appends `/v1/<path>`, so a query, fragment, user info or dot segment is
refused (provider/core/parsing.py::base_url_problem), and so are '?', '#', '%' and dot segments
in the auth mount, which becomes the login path.
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.vault.methods import CLOUD_KEYS, AwsAuth, AzureAuth, GcpAuth, parse_method
from backends.vault.objects import OBJECTS, VaultRef, parse_object
from backends.vault.options import Options
from backends.vault.selectors import SELECT_KEYS as SELECT_KEYS
from backends.vault.selectors import VaultSelection
from backends.vault.selectors import selection as selection
from provider.core.changes import Subject
from provider.core.model import ParseContext, StorePlan
from provider.core.parsing import BASE_URL_FORM, Problems, base_url_problem, go_bool, parse_objects

#: What a vault object or selector reads. (SELECT_KEYS and `selection`, re-exported above, are
#: the selectors' keys and parser: backends/vault/selectors.py.)
Ref = VaultRef | VaultSelection

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
    "auth_type": tuple(p + "AuthType" for p in _PREFIXES),
    "aws_region": tuple(p + "AWSRegion" for p in _PREFIXES),
    "aws_role_arn": tuple(p + "AWSRoleArn" for p in _PREFIXES),
    "aws_pod_identity": tuple(p + "AWSUsePodIdentity" for p in _PREFIXES),
    "aws_server_id": tuple(p + "AWSIAMServerID" for p in _PREFIXES),
    **{name: tuple(p + suffix for p in _PREFIXES) for name, suffix in CLOUD_KEYS.items()},
}
KEYS = frozenset(k for spellings in SPELLINGS.values() for k in spellings)
DEFAULT_MOUNT = "kubernetes"
_MOUNT_UNSAFE = re.compile(r"[?#%\\\x00-\x20\x7f]|[^\x00-\x7f]")


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
    #: The auth method (backends/vault/methods.py): kubernetes, jwt, aws, gcp or azure.
    method: str = "kubernetes"
    #: The cloud method's settings (method "aws", "gcp", "azure" only).
    aws: AwsAuth | None = None
    gcp: GcpAuth | None = None
    azure: AzureAuth | None = None

    def describe(self) -> str:
        namespace = f" namespace {self.namespace}" if self.namespace else ""
        method = f" {self.method}" if self.method not in ("kubernetes", "jwt") else ""
        return f"{self.address}{namespace} (auth/{self.mount}{method} role {self.role})"


def parse(params: Mapping[str, str], ctx: ParseContext[Options]) -> StorePlan[VaultStore, Ref]:
    problems = Problems(strict=ctx.strict)
    values = {name: _one_spelling(params, name, problems) for name in SPELLINGS}
    openbao = any(k.startswith(_OPENBAO_PREFIXES) and params.get(k) for k in params if k in KEYS)
    role = values["role"]
    if not role:
        problems.add(
            "roleName is required: the Vault role to log in as "
            "(also spelled vaultRoleName, baoRoleName, openbaoRoleName)"
        )
    address = values["address"] or _default_address(ctx, problems)
    if values["address"]:
        _check_address(params, address, problems)
    elif address and not address.startswith(("http://", "https://")):
        problems.add(f"vaultAddress: expected an http:// or https:// URL, got {address!r}")
    _check_mount(params, values["mount"], problems)
    method = parse_method(
        values,
        lambda name: _written(params, name),
        problems,
        default_audience="openbao" if openbao else "vault",
    )
    # Connection settings: the class's value, else the provider's flag (as upstream overlays
    # its flags with the class). Under `check` there are no flags.
    options = ctx.options
    default_skip = options.skip_verify if options else False
    store = VaultStore(
        address=address.rstrip("/"),
        namespace=_or_option(values, options, "namespace", "namespace").strip("/"),
        role=role,
        mount=values["mount"].strip("/") or method.default_mount,
        audience=values["audience"] or method.default_audience,
        tls=TLSConfig(
            ca_cert=_or_option(values, options, "ca_cert", "ca_cert"),
            ca_dir=_or_option(values, options, "ca_dir", "ca_dir"),
            server_name=_or_option(values, options, "server_name", "tls_server_name"),
            client_cert=_or_option(values, options, "client_cert", "client_cert"),
            client_key=_or_option(values, options, "client_key", "client_key"),
            skip_verify=go_bool(
                values["skip_verify"], "vaultSkipTLSVerify", problems, default_skip
            ),
        ),
        method=method.name,
        aws=method.aws,
        gcp=method.gcp,
        azure=method.azure,
    )
    if bool(store.tls.client_cert) != bool(store.tls.client_key):
        problems.add(
            "vaultTLSClientCertPath and vaultTLSClientKeyPath must be set together "
            "(a client certificate needs its key)"
        )
    # A class that selects its secrets (`select`) may list none by name.
    entry = functools.partial(parse_object, problems=problems)
    specs = parse_objects(values["objects"], OBJECTS, entry, ctx, problems)
    problems.raise_if_any()
    return StorePlan("vault", store, tuple(specs), tuple(problems.warnings))


def _one_spelling(params: Mapping[str, str], name: str, problems: Problems) -> str:
    """The value of a setting given under any of its spellings; two non-empty ones conflict."""
    given = [(k, params[k]) for k in SPELLINGS[name] if params.get(k, "") != ""]
    if len(given) > 1:
        keys = ", ".join(k for k, _ in given)
        problems.add(f"{keys} name the same setting; set only one of them")
    return given[0][1].strip() if given else ""


def _written(params: Mapping[str, str], name: str) -> str:
    """The spelling of a setting the class used (for messages)."""
    return next((k for k in SPELLINGS[name] if params.get(k, "") != ""), SPELLINGS[name][0])


def _check_address(params: Mapping[str, str], address: str, problems: Problems) -> None:
    """The class's address is where the login POST and every read go, as `{address}/v1/{path}`:
    upstream's Go client keeps only scheme, user, host and path of it (a query or fragment is
    dropped; the path is a prefix, `path.Join`ed); we refuse what it would drop, and user info,
    rather than build a different URL than the class seems to name (provider/core/parsing.py)."""
    problem = base_url_problem(address)
    if problem:
        problems.add(f"{_written(params, 'address')}: {problem}; write it as {BASE_URL_FORM}")


def _check_mount(params: Mapping[str, str], mount: str, problems: Problems) -> None:
    """The auth mount becomes the login path `auth/<mount>/login`, where a '?' or '#' would cut
    the path short and yarl resolves '.', '..' and escapes; upstream's Go client escapes '?' and
    '#' into the path and cleans dot segments. Refused, so the login goes where the text says."""
    path = mount.strip("/")
    if not path:
        return
    if _MOUNT_UNSAFE.search(path) or any(s in ("", ".", "..") for s in path.split("/")):
        problems.add(
            f"{_written(params, 'mount')}: an auth mount path must not hold '?', '#', '%', a "
            "backslash, a space, a non-ASCII character or an empty, '.' or '..' segment; "
            "expected e.g. kubernetes or clusters/prod"
        )


def _default_address(ctx: ParseContext[Options], problems: Problems) -> str:
    if ctx.offline:
        problems.warn("vaultAddress is not set: the provider's --vault-addr / VAULT_ADDR is used")
        return ""
    addr = ctx.options.addr if ctx.options else ""
    if not addr:
        problems.add(
            "vaultAddress is not set and the provider has no default: set vaultAddress in the "
            "SecretProviderClass, or start the provider with --vault-addr (or VAULT_ADDR)"
        )
    return str(addr)


def _or_option(values: Mapping[str, str], options: Any, name: str, option: str) -> str:
    return values[name] or str(getattr(options, option, None) or "")


def audiences(store: VaultStore) -> tuple[str, ...]:
    """The audiences of the pod tokens a mount of this class needs (`check --json`)."""
    return (store.audience,)


def lifetime(ref: Ref) -> tuple[str, str] | None:
    """What an object's answer is expected to carry (`check --json`): ("lease" or
    "certificate", why), or None for a plain secret. At a mount the answer decides: a lease_id
    with a lease_duration, or a certificate, makes the value a credential held per pod
    (provider/mount/lifetimes.py). A selection's KV secrets are plain secrets."""
    if isinstance(ref, VaultSelection):
        return None
    parts = ref.path.split("/")
    if "creds" in parts[1:-1]:
        return ("lease", f"{ref.path} is a secrets engine's credentials path (leased)")
    if ref.method != "GET" and any(p in ("issue", "sign") for p in parts[1:-1]):
        return ("certificate", f"{ref.method} {ref.path} issues a certificate (notAfter)")
    if ref.method != "GET":
        return ("lease", f"{ref.method} {ref.path} is a dynamic secret's request")
    return None


#: The segments KV version 2 puts after the mount (`secret/data/app`, `secret/metadata/app`, ...):
#: every form names one secret in the change feed.
_KV2_FORMS = frozenset({"data", "metadata", "delete", "destroy", "undelete", "subkeys"})
#: Mounts every Vault has that are never KV: a read there is not announced by a KV write.
_NOT_KV = ("sys/", "auth/", "identity/", "cubbyhole/")


def kv_name(namespace: str, path: str) -> str:
    """A KV secret's name in the change feed (backends/vault/changes.py names an audit entry's
    `request.namespace.path` and `request.path` by it, `subject` a ref): the namespace-qualified
    path without KV v2's API segments. Neither side knows where the mount ends (a mount may be
    `team/kv`, a v1 secret may be `app/data/x`), so every such segment goes wherever it is:
    the forms of one secret always meet, and unlike secrets that meet are over-matched, which
    costs a read."""
    segments = f"{namespace}/{path}".split("/")
    return "/".join(s for s in segments if s and s not in _KV2_FORMS)


def subject(store: VaultStore, ref: Ref) -> Subject | None:
    """What a ref answers to in the feed: the KV secret it reads at the store's address, every
    secret under a selection's path, nothing for a leased or issued value or a built-in mount."""
    if isinstance(ref, VaultSelection):
        name = kv_name(store.namespace, ref.path)
        return Subject.of(store.address, name + "/" if name else "", prefix=True)
    if lifetime(ref) is not None or ref.path.startswith(_NOT_KV):
        return None
    # The client sends the path as written and Vault decodes its escapes; audit entries show
    # it decoded.
    return Subject.of(store.address, kv_name(store.namespace, urllib.parse.unquote(ref.path)))


#: The object entries of a class of several stores, as this dialect's `objects`.
listed = OBJECTS.listed
