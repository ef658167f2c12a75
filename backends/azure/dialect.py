"""The Azure Key Vault dialect: the Azure provider's SecretProviderClass parameters.

    parameters:
      backend: azure
      keyvaultName: kv-name
      tenantID: <tenant>          # `tenantId` (the older spelling) is accepted too
      clientID: <client id>       # workload identity; else nodePublishSecretRef or VM identity
      useAzureTokenProxy: "true"  # identity binding: clientID's login through the AKS token proxy
      cloudName: ""               # AzurePublicCloud (default) | AzureUSGovernmentCloud | ...
      objects: |
        array:
          - |
            objectName: secret1
            objectType: secret     # secret | key | cert
            objectAlias: db.txt
            objectVersionHistory: 3
      select: |                   # ours: every enabled secret by name prefix and tags
        - namePrefix: app-
          tags: {team: payments}
          directory: app

`objects` keeps the upstream shape — a YAML map whose `array` is a list of YAML *strings*, one
object each — so a class moves over unchanged. Nothing here reads files: `cloudEnvFileName`
names a file on the node that `store.py` reads when it authenticates (`check` stays offline).
A class with `select` (backends/azure/selectors.py) may list no objects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import yaml

from backends.azure import selectors
from backends.azure.objects import AzureRef, parse_objects
from backends.azure.options import Options
from backends.azure.selectors import AzureSelection
from provider.core.changes import Subject
from provider.core.model import ObjectSpec, ParseContext, StorePlan
from provider.core.parsing import Problems, go_bool, plain_secrets

KEYS = frozenset(
    {
        "keyvaultName",
        "tenantID",
        "tenantId",
        "clientID",
        "cloudName",
        "cloudEnvFileName",
        "useVMManagedIdentity",
        "userAssignedIdentityID",
        "usePodIdentity",
        "useAzureTokenProxy",
        "objects",
    }
)
AuthMode = Literal[
    "workload-identity", "identity-binding", "service-principal", "vm-managed-identity"
]
#: The pod token audience of each mode that logs in as the pod (upstream's pkg/auth/auth.go).
AUDIENCES: dict[str, str] = {
    "workload-identity": "api://AzureADTokenExchange",
    "identity-binding": "api://AKSIdentityBinding",
}
#: The filter keys of a `select` entry (backends/azure/selectors.py).
SELECT_KEYS = selectors.SELECT_KEYS
#: What an Azure object or selector reads.
Ref = AzureRef | AzureSelection
#: Upstream's identity switches, of which at most one may be "true" (provider.go).
_SWITCHES = ("usePodIdentity", "useVMManagedIdentity", "useAzureTokenProxy")


@dataclass(frozen=True)
class Cloud:
    name: str
    authority_host: str
    vault_dns_suffix: str


#: The clouds `cloudName` may name (matched case-insensitively, as upstream). AzureStackCloud
#: has no fixed endpoints: they come from the `cloudEnvFileName` file on the node.
CLOUDS = {
    c.name.lower(): c
    for c in (
        Cloud("AzurePublicCloud", "https://login.microsoftonline.com", "vault.azure.net"),
        Cloud(
            "AzureUSGovernmentCloud", "https://login.microsoftonline.us", "vault.usgovcloudapi.net"
        ),
        Cloud("AzureChinaCloud", "https://login.chinacloudapi.cn", "vault.azure.cn"),
        # Closed in October 2021, still a name go-autorest (and so upstream) accepts.
        Cloud("AzureGermanCloud", "https://login.microsoftonline.de", "vault.microsoftazure.de"),
        Cloud("AzureStackCloud", "", ""),
    )
}

# Tenant and client ids are GUIDs (tenants may be domain names); they become URL path segments
# and identity key parts, so nothing else is let through.
_DIRECTORY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")
# Key Vault names: 3-24 of letters, digits and hyphens (they become a DNS label).
_VAULT_NAME = re.compile(r"^[-A-Za-z0-9]{3,24}$")


@dataclass(frozen=True)
class AzureStore:
    """Where and as whom a class reads: one Key Vault, one tenant, one way to log in."""

    vault_name: str
    tenant_id: str
    cloud: str
    cloud_env_file: str
    auth: AuthMode
    client_id: str = ""
    user_assigned_identity_id: str = ""

    def describe(self) -> str:
        return f"azure key vault {self.vault_name} ({self.cloud}, tenant {self.tenant_id})"


def parse(params: Mapping[str, str], ctx: ParseContext[Options]) -> StorePlan[AzureStore, Ref]:
    problems = Problems(strict=ctx.strict)
    store = _parse_store(params, problems)
    specs = parse_objects(params.get("objects", ""), ctx, problems)
    problems.raise_if_any()
    assert store is not None
    # ObjectSpec is invariant in its ref: the objects' AzureRefs as the class's Ref.
    objects = cast(tuple[ObjectSpec[Ref], ...], tuple(specs))
    return StorePlan("azure", store, objects, tuple(problems.warnings))


def selection(
    entry: Mapping[str, Any], store: AzureStore, limit: int, where: str, problems: Problems
) -> AzureSelection | None:
    """A `select` entry: `namePrefix` and `tags` (backends/azure/selectors.py)."""
    return selectors.selection(entry, limit, where, problems)


def _parse_store(params: Mapping[str, str], problems: Problems) -> AzureStore | None:
    vault = params.get("keyvaultName", "").strip()
    if not vault:
        problems.add("keyvaultName is required: the name of the Key Vault (3-24 characters)")
    elif not _VAULT_NAME.match(vault):
        problems.add(
            f"keyvaultName {vault!r} is not a Key Vault name: 3-24 letters, digits and hyphens"
        )
    tenant = _tenant(params, problems)
    cloud_raw = params.get("cloudName", "").strip()
    cloud = CLOUDS.get((cloud_raw or "AzurePublicCloud").lower())
    if cloud is None:
        names = ", ".join(c.name for c in CLOUDS.values())
        problems.add(f"cloudName {cloud_raw!r} is not a known cloud; expected one of {names}")
    env_file = params.get("cloudEnvFileName", "").strip()
    if cloud is not None and cloud.name == "AzureStackCloud" and not env_file:
        problems.add(
            "cloudName AzureStackCloud needs cloudEnvFileName: the path, on the node, of the "
            "JSON file with the cloud's endpoints"
        )
    elif env_file and cloud is not None and cloud.name != "AzureStackCloud":
        problems.warn(f"cloudEnvFileName is ignored for cloudName {cloud.name}")
    # Upstream trims the switches and parses them with Go's strconv.ParseBool.
    switches = {key: go_bool(params.get(key, "").strip(), key, problems) for key in _SWITCHES}
    if switches["usePodIdentity"]:
        problems.add(
            'usePodIdentity "true" is not supported (AAD pod identity is deprecated upstream); '
            "use workload identity: set clientID to the identity federated with the pod's "
            "service account (audience api://AzureADTokenExchange), or an identity binding "
            '(useAzureTokenProxy "true"), and remove usePodIdentity or set it to "false"'
        )
    on = [key for key, value in switches.items() if value]
    if len(on) > 1:
        problems.add(
            f"only one identity mode can be enabled at a time: {' and '.join(on)} are "
            '"true"; keep one'
        )
    auth = _auth_mode(params, switches, problems)
    if problems.items or cloud is None or auth is None:
        return None
    return AzureStore(
        vault_name=vault,
        tenant_id=tenant,
        cloud=cloud.name,
        cloud_env_file=env_file if cloud.name == "AzureStackCloud" else "",
        auth=auth,
        client_id=params.get("clientID", "").strip(),
        user_assigned_identity_id=params.get("userAssignedIdentityID", "").strip(),
    )


def _tenant(params: Mapping[str, str], problems: Problems) -> str:
    new, old = params.get("tenantID", "").strip(), params.get("tenantId", "").strip()
    if new and old and new != old:
        problems.add("tenantID and tenantId are both set, to different values; keep tenantID")
    tenant = new or old
    # Name the key as the class wrote it: upstream's examples spell it tenantId.
    written = "tenantID" if new else "tenantId"
    if not tenant:
        problems.add(
            "tenantID is required (or tenantId, as the upstream examples spell it): the "
            "Microsoft Entra tenant of the Key Vault"
        )
    elif not _DIRECTORY_ID.match(tenant):
        problems.add(f"{written} {tenant!r}: expected a tenant id (GUID) or domain name")
    return tenant


def _auth_mode(
    params: Mapping[str, str], switches: Mapping[str, bool], problems: Problems
) -> AuthMode | None:
    use_vm, use_proxy = switches["useVMManagedIdentity"], switches["useAzureTokenProxy"]
    client_id = params.get("clientID", "").strip()
    if client_id and not _DIRECTORY_ID.match(client_id):
        problems.add(f"clientID {client_id!r}: expected the client id (a GUID) of an identity")
    uami = params.get("userAssignedIdentityID", "").strip()
    if uami and not _DIRECTORY_ID.match(uami):
        problems.add(f"userAssignedIdentityID {uami!r}: expected a client id (a GUID)")
    if use_proxy and not use_vm:
        if not client_id:
            problems.add(
                'clientID is required for identity binding (useAzureTokenProxy "true"): the '
                "client id of the managed identity bound to the cluster, which the pod's service "
                "account may use"
            )
            return None
        return "identity-binding"
    if use_vm and client_id and not use_proxy:
        problems.add(
            'useVMManagedIdentity "true" and clientID (workload identity) are both set; '
            "choose one way to authenticate"
        )
        return None
    if params.get("userAssignedIdentityID", "").strip() and not use_vm:
        problems.warn('userAssignedIdentityID is ignored unless useVMManagedIdentity is "true"')
    if use_vm:
        return "vm-managed-identity"
    return "workload-identity" if client_id else "service-principal"


def audiences(store: AzureStore) -> tuple[str, ...]:
    """The audience of the pod token a mount of this class needs (`check --json`, `mount
    --csidriver`): workload identity's or identity binding's; the other modes log in without the
    pod's token."""
    audience = AUDIENCES.get(store.auth)
    return (audience,) if audience else ()


def object_name(kind: str, name: str) -> str:
    """A Key Vault object's name in the change feed, `<kind>/<name>` (kind: secret, key, cert),
    lowercased as Key Vault compares names; backends/azure/changes.py names an event's object by
    it, `subject` a ref."""
    return f"{kind}/{name.lower()}"


def subject(store: AzureStore, ref: Ref) -> Subject | None:
    """What a ref answers to in the feed: its object in its vault (the scope, lowercased), every
    secret a selection's prefix starts (tags only narrow it: `secret/` when it has none). A
    secret ref that reads a certificate's secret (objectFormat pfx) is named as a secret: the
    source names a certificate's event by each of its views."""
    scope = store.vault_name.lower()
    if isinstance(ref, AzureSelection):
        return Subject.of(scope, object_name("secret", ref.prefix), prefix=True)
    return Subject.of(scope, object_name(ref.object_type, ref.name))


#: Its answers are plain secrets: no lease, no certificate issued per read (`check`).
lifetime = plain_secrets


def listed(items: list[dict[str, Any]]) -> dict[str, str]:
    """Object entries of a class of several stores (provider/mount/stores.py) as the parameter
    `parse` reads them: its `objects` map's `array`, each entry the map an `array:` string
    holds."""
    return {"objects": yaml.safe_dump({"array": items}, sort_keys=False)}
