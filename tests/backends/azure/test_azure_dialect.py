"""The Azure dialect parser: every upstream parameter, and messages naming the field."""

from __future__ import annotations

import pytest

from backends.azure.dialect import KEYS, AzureStore, parse
from backends.azure.objects import AzureRef
from provider.core.errors import InvalidParameters
from provider.core.model import ParseContext
from tests.backends.azure.test_azure_fetch import objects

TENANT = "tenant-1"
BASE = {"keyvaultName": "kv1", "tenantID": TENANT, "clientID": "client-1"}
ONE = objects("objectName: s\nobjectType: secret")


def parsed(objs: str = ONE, ctx: ParseContext | None = None, **params: str):  # type: ignore[no-untyped-def]
    merged = {**BASE, "objects": objs, **params}
    return parse(
        {k: v for k, v in merged.items() if v is not None}, ctx or ParseContext(options=object())
    )


def error(objs: str = ONE, **params: str) -> str:
    with pytest.raises(InvalidParameters) as info:
        parsed(objs, **params)
    return str(info.value)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"keyvaultName": ""}, "keyvaultName is required"),
        ({"keyvaultName": "ab"}, "keyvaultName 'ab'"),
        ({"keyvaultName": "kv_1"}, "keyvaultName 'kv_1'"),
        ({"keyvaultName": "a" * 25}, "keyvaultName"),
        ({"tenantID": ""}, "tenantID is required"),
        ({"tenantId": "other"}, "tenantID and tenantId"),
        ({"tenantID": "a/b"}, "tenantID 'a/b'"),
        ({"clientID": "x|y"}, "clientID 'x|y'"),
        ({"userAssignedIdentityID": "../mi"}, "userAssignedIdentityID '../mi'"),
        ({"cloudName": "AzureBlackForestCloud"}, "cloudName 'AzureBlackForestCloud'"),
        ({"cloudName": "AzureStackCloud"}, "needs cloudEnvFileName"),
        ({"usePodIdentity": "true"}, 'usePodIdentity "true" is not supported'),
        (
            {"useAzureTokenProxy": "TRUE", "useVMManagedIdentity": "true"},
            "only one identity mode can be enabled at a time",
        ),
        ({"useAzureTokenProxy": "on"}, "useAzureTokenProxy: expected"),
        ({"usePodIdentity": "maybe"}, "usePodIdentity: expected"),
        ({"useVMManagedIdentity": "yes"}, "useVMManagedIdentity: expected"),
        ({"useVMManagedIdentity": "true"}, 'useVMManagedIdentity "true" and clientID'),
        ({"objects": ""}, "objects is required"),
        ({"objects": "- a\n- b"}, "objects: expected a YAML map with an `array:`"),
        ({"objects": "array: [unclosed"}, "objects: invalid YAML"),
        ({"objects": "array: text"}, "objects.array: expected a YAML list"),
        ({"objects": "array: []"}, "objects.array is empty"),
    ],
)
def test_azure_bad_top_level_parameters(params: dict[str, str], expected: str) -> None:
    objs = params.pop("objects", ONE)
    assert expected in error(objs, **params)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("just text", "objects.array[0]: expected a YAML string holding a map"),
        ("objectName: [x", "objects.array[0]: invalid YAML"),
        ("objectName: s\nobjectType: secret\nobjectNotAfter: x", "objectNotAfter is not supported"),
        ("objectType: secret", "objects.array[0].objectName is required"),
        ("objectName: a/b\nobjectType: secret", "objects.array[0].objectName 'a/b'"),
        ("objectName: s", "objects.array[0].objectType: expected secret, key or cert"),
        ("objectName: s\nobjectType: blob", "objectType: expected secret, key or cert, got 'blob'"),
        ("objectName: s\nobjectType: secret\nobjectVersion: ../x", "objectVersion '../x'"),
        ("objectName: s\nobjectType: secret\nobjectVersionHistory: many", "objectVersionHistory"),
        ("objectName: s\nobjectType: secret\nobjectVersionHistory: -1", "objectVersionHistory"),
        ("objectName: s\nobjectType: secret\nobjectVersionHistory: 1000", "objectVersionHistory"),
        (
            "objectName: s\nobjectType: secret\nobjectFormat: der",
            "objectFormat: expected pem or pfx",
        ),
        ("objectName: s\nobjectType: cert\nobjectFormat: pfx", "objectFormat pfx needs objectType"),
        ("objectName: s\nobjectType: secret\nobjectEncoding: latin1", "objectEncoding: expected"),
        ("objectName: s\nobjectType: key\nobjectEncoding: hex", "objectEncoding is only supported"),
        ("objectName: s\nobjectType: secret\nfilePermission: '0999'", "filePermission"),
        ("objectName: s\nobjectType: secret\nfilePermission: rw", "filePermission"),
        ("objectName: s\nobjectType: secret\ndecode: rot13", "objects.array[0].decode"),
        ("objectName: s\nobjectType: secret\nextract: '[a'", "objects.array[0].extract"),
    ],
)
def test_azure_bad_objects_name_the_field(entry: str, expected: str) -> None:
    assert expected in error(objects(entry))


def test_azure_every_problem_is_reported_at_once() -> None:
    text = error(objects("objectName: s", "objectType: key"), keyvaultName="", tenantID="")
    for part in ("keyvaultName", "tenantID", "[0].objectType", "[1].objectName"):
        assert part in text


def test_azure_duplicate_file_names_name_both_fields() -> None:
    text = error(
        objects(
            "objectName: a\nobjectType: secret\nobjectAlias: same",
            "objectName: b\nobjectType: key\nobjectAlias: same",
        )
    )
    assert "objects.array[0].objectAlias" in text and "objects.array[1].objectAlias" in text


def test_azure_too_many_objects() -> None:
    with pytest.raises(InvalidParameters, match="over the limit of 1"):
        parsed(
            objects("objectName: a\nobjectType: secret", "objectName: b\nobjectType: secret"),
            ParseContext(options=object(), max_objects=1),
        )


def test_azure_full_object_and_store() -> None:
    plan = parsed(
        objects(
            "objectName: tls\nobjectType: SECRET\nobjectAlias: tls.pfx\nobjectFormat: PFX\n"
            "objectEncoding: Base64\nfilePermission: '0400'\nobjectVersion: abc123\n"
            "objectVersionHistory: 3",
            "objectName: plain\nobjectType: secret\nobjectEncoding: utf-8\nobjectVersionHistory: 1",
            "objectName: hexed\nobjectType: secret\nobjectEncoding: hex\nextract: password",
        ),
        tenantID=None,  # type: ignore[arg-type]
        tenantId=TENANT,
        cloudName="azureusgovernmentcloud",
        usePodIdentity="false",
        useAzureTokenProxy="",
        useVMManagedIdentity="false",
    )
    assert plan.store == AzureStore(
        "kv1", TENANT, "AzureUSGovernmentCloud", "", "workload-identity", "client-1"
    )
    tls, plain, hexed = plan.objects
    assert (
        tls.name == "tls.pfx" and tls.mode == 0o400 and tls.field == "objects.array[0].objectAlias"
    )
    # objectEncoding alone is the backend's (the file keeps Key Vault's version id); after our
    # `extract` it is the core's last transform.
    assert tls.ref == AzureRef("secret", "tls", "abc123", 3, True, "base64")
    assert tls.transforms.identity
    assert plain.ref == AzureRef("secret", "plain") and plain.transforms.decode is None
    assert plain.mode is None and plain.field == "objects.array[1].objectName"
    assert hexed.ref == AzureRef("secret", "hexed")
    assert hexed.transforms.decode == "hex" and hexed.transforms.extract == "password"


def test_azure_inline_maps_and_service_principal_default() -> None:
    plan = parsed("array:\n  - {objectName: s, objectType: cert}", clientID="")
    assert plan.store.auth == "service-principal"
    assert plan.objects[0].ref == AzureRef("cert", "s")


def test_azure_warnings_for_ignored_parameters() -> None:
    plan = parsed(userAssignedIdentityID="mi", cloudEnvFileName="/etc/kubernetes/cloud.json")
    assert any("userAssignedIdentityID is ignored" in w for w in plan.warnings)
    assert any("cloudEnvFileName is ignored" in w for w in plan.warnings)


def test_azure_check_reads_no_file() -> None:
    # Offline `check`: an AzureStack class whose env file exists only on the node parses.
    plan = parsed(
        cloudName="AzureStackCloud", cloudEnvFileName="/nonexistent/cloud.json", ctx=ParseContext()
    )
    assert plan.store.cloud_env_file == "/nonexistent/cloud.json"


def test_azure_keys_list_every_top_level_parameter() -> None:
    assert {
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
    } == KEYS


# Issue 32: no class parameter names an Azure endpoint: keyvaultName becomes the first DNS
# label of https://<name>.<cloud's suffix>, tenant and client ids become path segments of the
# authority's URL, cloudName picks from a fixed table, and cloudEnvFileName names a node file
# (the operator's). So none may carry a URL part.
HOSTILE_NAMES = [
    "kv1?x=1",
    "kv1#frag",
    "kv1@evil",
    "evil.example/kv1",
    "kv1:443",
    "%2e%2e",
    "..",
    "kv 1",
    "kv1\\x",
    "kv\uff11x",
]


@pytest.mark.parametrize(
    ("key", "needle"),
    [
        ("keyvaultName", "keyvaultName"),
        ("tenantID", "tenantID"),
        ("tenantId", "tenantId"),
        ("clientID", "clientID"),
        ("userAssignedIdentityID", "userAssignedIdentityID"),
    ],
)
@pytest.mark.parametrize("value", HOSTILE_NAMES)
def test_azure_names_cannot_carry_url_parts(key: str, needle: str, value: str) -> None:
    params = {key: value, "tenantID": None} if key == "tenantId" else {key: value}
    if key == "userAssignedIdentityID":
        params |= {"useVMManagedIdentity": "true", "clientID": None}
    assert f"{needle} " in error(**params)  # type: ignore[arg-type]


def test_azure_keyvault_name_cannot_leave_the_clouds_domain() -> None:
    # A dot would make the name several labels: <evil.example>.vault.azure.net is still
    # Azure's, but "a.b" is no Key Vault name, and the pattern keeps it one label.
    assert "keyvaultName 'evil.example'" in error(keyvaultName="evil.example")
