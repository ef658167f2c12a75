"""The vault dialect parser: upstream parameters, OpenBao spellings, defaults, and every mistake
reported by field name."""

from __future__ import annotations

import pytest

from backends.vault.dialect import KEYS, VaultStore, parse
from backends.vault.objects import VaultRef
from backends.vault.options import Options
from provider.core.errors import InvalidParameters
from provider.core.model import ParseContext, Transforms

ONLINE = ParseContext(options=Options(addr="https://vault.example:8200"))
OBJECTS = "- objectName: db\n  secretPath: secret/data/db\n"


def store_of(params: dict[str, str], ctx: ParseContext = ONLINE) -> VaultStore:
    store = parse({"objects": OBJECTS, **params}, ctx).store
    assert isinstance(store, VaultStore)
    return store


def test_minimal_class_takes_the_provider_defaults() -> None:
    store = store_of({"roleName": "app"})
    assert store.address == "https://vault.example:8200"
    assert (store.role, store.mount, store.audience, store.namespace) == (
        "app",
        "kubernetes",
        "vault",
        "",
    )


@pytest.mark.parametrize(
    ("params", "audience"),
    [
        ({"roleName": "app"}, "vault"),
        ({"openbaoRoleName": "app"}, "openbao"),
        ({"baoRoleName": "app"}, "openbao"),
        ({"roleName": "app", "openbaoAddress": "http://bao:8200"}, "openbao"),
        ({"roleName": "app", "openbaoAuthMountPath": "jwt"}, "openbao"),
        ({"roleName": "app", "openbaoAuthMountPath": "jwt", "audience": "custom"}, "custom"),
        # vaultRoleName is a synonym but not an OpenBao spelling.
        ({"vaultRoleName": "app"}, "vault"),
    ],
)
def test_default_audience_follows_the_spelling(params: dict[str, str], audience: str) -> None:
    assert store_of(params).audience == audience


@pytest.mark.parametrize(
    ("params", "mount"),
    [
        ({}, "kubernetes"),
        ({"vaultAuthMountPath": ""}, "kubernetes"),
        ({"vaultAuthMountPath": "jwt"}, "jwt"),
        ({"vaultKubernetesMountPath": "k8s-prod"}, "k8s-prod"),
        ({"openbaoAuthMountPath": "/jwt/"}, "jwt"),
        ({"baoKubernetesMountPath": "kube"}, "kube"),
        # An empty spelling does not conflict with a set one: empty means "the default".
        ({"vaultAuthMountPath": "", "vaultKubernetesMountPath": "old"}, "old"),
    ],
)
def test_auth_mount_spellings(params: dict[str, str], mount: str) -> None:
    assert store_of({"roleName": "app", **params}).mount == mount


def test_every_setting_has_its_openbao_spellings() -> None:
    store = store_of(
        {
            "openbaoRoleName": "r",
            "baoAddress": "https://bao:8200/",
            "openbaoNamespace": "team/",
            "baoCACertPath": "/ca.pem",
            "openbaoCADirectory": "/cas",
            "baoTLSServerName": "bao.internal",
            "openbaoTLSClientCertPath": "/c.pem",
            "openbaoTLSClientKeyPath": "/k.pem",
            "baoSkipTLSVerify": "true",
        }
    )
    assert store.address == "https://bao:8200"
    assert store.namespace == "team"
    tls = store.tls
    assert (tls.ca_cert, tls.ca_dir, tls.server_name) == ("/ca.pem", "/cas", "bao.internal")
    assert (tls.client_cert, tls.client_key, tls.skip_verify) == ("/c.pem", "/k.pem", True)


@pytest.mark.parametrize("value", ["1", "t", "TRUE", "True", "true"])
def test_skip_verify_accepts_go_booleans_like_upstream(value: str) -> None:
    assert store_of({"roleName": "a", "vaultSkipTLSVerify": value}).tls.skip_verify


def test_class_address_wins_over_the_provider_default() -> None:
    assert store_of({"roleName": "a", "vaultAddress": "http://x:1"}).address == "http://x:1"


def test_offline_check_warns_about_the_missing_address() -> None:
    plan = parse({"roleName": "a", "objects": OBJECTS}, ParseContext(options=None))
    assert any("vaultAddress" in w and "--vault-addr" in w for w in plan.warnings)


def test_unknown_top_level_keys_are_ignored() -> None:
    plan = parse({"roleName": "a", "objects": OBJECTS, "someVolumeAttribute": "x"}, ONLINE)
    assert len(plan.objects) == 1
    assert "someVolumeAttribute" not in KEYS


def test_objects_become_refs_and_transforms() -> None:
    objects = """
- objectName: password
  secretPath: secret/data/db?version=3
  secretKey: password
  filePermission: 0400
- objectName: cert
  secretPath: /pki/issue/web
  method: post
  secretArgs: {common_name: web.example, ttl: 1h}
  secretKey: certificate
- objectName: key
  secretPath: pki/issue/web
  method: POST
  secretArgs: {ttl: 1h, common_name: web.example}
  secretKey: private_key
  encoding: base64
- objectName: whole
  secretPath: kv1/app
  encoding: utf-8
  extract: users[0].name
"""
    plan = parse({"roleName": "a", "objects": objects}, ONLINE)
    password, cert, key, whole = plan.objects
    assert password.ref == VaultRef("secret/data/db", "GET", (("version", "3"),))
    assert password.mode == 0o400
    assert password.transforms == Transforms(extract_key="password", parse_as="json")
    # Same path, method and args (in another order): one read, so both come from one lease.
    assert cert.ref == key.ref
    assert isinstance(cert.ref, VaultRef)
    assert cert.ref.body == '{"common_name":"web.example","ttl":"1h"}'
    assert key.transforms.decode == "base64"
    assert whole.transforms.extract == "users[0].name"
    assert whole.transforms.decode is None
    assert password.field == "objects[0].objectName"


def test_secret_args_with_get_is_a_warning() -> None:
    objects = "- {objectName: a, secretPath: x/y, secretArgs: {k: v}}"
    plan = parse({"roleName": "a", "objects": objects}, ONLINE)
    assert any("objects[0].secretArgs" in w and "POST" in w for w in plan.warnings)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"roleName": ""}, "roleName is required"),
        ({"objects": ""}, "objects is required"),
        ({"objects": "- [unclosed"}, "objects: invalid YAML at line 1"),
        ({"objects": "objectName: a"}, "objects: expected a YAML list"),
        ({"objects": "- just-a-string"}, "objects[0]: expected a map"),
        ({"objects": "- {secretPath: a/b}"}, "objects[0].objectName is required"),
        ({"objects": "- {objectName: a}"}, "objects[0].secretPath is required"),
        (
            {"objects": "- {objectName: a, secretPath: a/b}\n- {objectName: a, secretPath: c/d}"},
            "objectName 'a' is used by objects[0].objectName, objects[1].objectName",
        ),
        ({"objects": "- {objectName: a, secretPath: a/b, method: DELETE}"}, "objects[0].method"),
        ({"objects": "- {objectName: a, secretPath: a/b, encoding: rot13}"}, "objects[0].encoding"),
        (
            {"objects": "- {objectName: a, secretPath: a/b, secretArgs: [1]}"},
            "objects[0].secretArgs",
        ),
        (
            {"objects": "- {objectName: a, secretPath: a/b, filePermission: 0o1777}"},
            "objects[0].filePermission",
        ),
        (
            {"objects": "- {objectName: a, secretPath: a/b, filePermission: rw}"},
            "objects[0].filePermission",
        ),
        (
            {"objects": "- {objectName: a, secretPath: a/b, extract: 'db-password'}"},
            "objects[0].extract",
        ),
        (
            {"objects": "- {objectName: a, secretPath: 'a/b?version=latest'}"},
            "objects[0].secretPath: ?version=",
        ),
        (
            {"objects": "- {objectName: a, secretPath: 'https://vault/v1/a'}"},
            "objects[0].secretPath",
        ),
        ({"objects": "- {objectName: a, secretPath: '../sys/mounts'}"}, "objects[0].secretPath"),
        (  # escaped dot segments: the HTTP client would resolve them (not the audited path)
            {"objects": "- {objectName: a, secretPath: 'secret/data/%2e%2e/%2E%2e/sys/mounts'}"},
            "objects[0].secretPath",
        ),
        ({"objects": "- {objectName: a, secretPath: 'secret/./data/a'}"}, "objects[0].secretPath"),
        ({"objects": "- {objectName: a, secretPath: a/b, secretKey: [x]}"}, "objects[0].secretKey"),
        ({"vaultSkipTLSVerify": "yes"}, "vaultSkipTLSVerify"),
        ({"vaultAddress": "vault:8200"}, "vaultAddress: expected an http:// or https:// URL"),
        ({"vaultTLSClientCertPath": "/c.pem"}, "vaultTLSClientKeyPath must be set together"),
        (
            {"vaultAuthMountPath": "a", "vaultKubernetesMountPath": "b"},
            "vaultAuthMountPath, vaultKubernetesMountPath name the same setting",
        ),
        ({"roleName": "a", "openbaoRoleName": "b"}, "roleName, openbaoRoleName name the same"),
        ({"vaultAddress": "http://a", "baoAddress": "http://b"}, "vaultAddress, baoAddress"),
        ({"vaultNamespace": "a", "openbaoNamespace": "a"}, "name the same setting"),
    ],
)
def test_malformed_classes_name_the_field(params: dict[str, str], needle: str) -> None:
    full = {"roleName": "app", "objects": OBJECTS, **params}
    with pytest.raises(InvalidParameters) as info:
        parse(full, ONLINE)
    assert needle in str(info.value)


def test_missing_address_without_provider_default_is_an_error() -> None:
    with pytest.raises(InvalidParameters, match=r"vaultAddress is not set.*--vault-addr"):
        parse({"roleName": "a", "objects": OBJECTS}, ParseContext(options=Options()))


def test_every_problem_is_reported_at_once() -> None:
    objects = "- {objectName: a, method: DELETE}\n- {secretPath: x/y, encoding: rot13}"
    with pytest.raises(InvalidParameters) as info:
        parse({"objects": objects, "vaultSkipTLSVerify": "maybe"}, ONLINE)
    text = str(info.value)
    for needle in (
        "roleName",
        "vaultSkipTLSVerify",
        "objects[0].secretPath",
        "objects[0].method",
        "objects[1].objectName",
        "objects[1].encoding",
    ):
        assert needle in text


def test_too_many_objects_is_refused() -> None:
    objects = "\n".join(f"- {{objectName: o{i}, secretPath: a/{i}}}" for i in range(4))
    with pytest.raises(InvalidParameters, match="over the limit of 3"):
        parse({"roleName": "a", "objects": objects}, ParseContext(Options(addr="http://a"), 3))


@pytest.mark.parametrize(
    "path", ["secret/data/db", "/secret/data/db", "v1/secret/data/db", "/v1/secret/data/db"]
)
def test_secret_path_accepts_the_api_prefix_like_upstream(path: str) -> None:
    plan = parse({"roleName": "a", "objects": f"- {{objectName: a, secretPath: '{path}'}}"}, ONLINE)
    assert plan.objects[0].ref == VaultRef("secret/data/db")


def test_provider_flags_are_defaults_the_class_overrides() -> None:
    options = Options(
        addr="https://flag:8200",
        namespace="flag-ns",
        ca_cert="/flag/ca.pem",
        tls_server_name="flag.example",
        skip_verify=True,
    )
    ctx = ParseContext(options=options)
    store = store_of({"roleName": "a"}, ctx)
    assert (store.address, store.namespace) == ("https://flag:8200", "flag-ns")
    assert (store.tls.ca_cert, store.tls.server_name, store.tls.skip_verify) == (
        "/flag/ca.pem",
        "flag.example",
        True,
    )
    overridden = store_of(
        {
            "roleName": "a",
            "vaultNamespace": "class-ns",
            "vaultCACertPath": "/class/ca.pem",
            "vaultSkipTLSVerify": "false",
        },
        ctx,
    )
    assert (overridden.namespace, overridden.tls.ca_cert) == ("class-ns", "/class/ca.pem")
    assert overridden.tls.skip_verify is False


# Issue 32: the client builds `{address}/v1/{path}`, so a '?' or '#' in the address let a class
# choose the whole path of the login POST and of every read (the audit trail naming another).
# Upstream's Go client keeps scheme, user, host and path of the address (path.Join'ed as a
# prefix, which a reverse proxy may need); we also refuse user info (credentials in a class).
REFUSED_ADDRESSES = [
    ("vaultAddress", "https://vault:8200/v1/auth/other/login?", "has a query ('?')"),
    ("vaultAddress", "https://vault:8200/v1/secret/data/x#", "has a fragment ('#')"),
    ("vaultAddress", "https://vault:8200?x=1", "has a query ('?')"),
    ("baoAddress", "http://bao:8200/?", "has a query ('?')"),
    ("openbaoAddress", "https://bao:8200#", "has a fragment ('#')"),
    ("vaultAddress", "https://admin:hunter2@vault:8200", "has user info"),
    ("openbaoAddress", "https://vault.corp@evil.example", "has user info"),
    ("vaultAddress", "https://vault:8200/a/../v1/secret", "path prefix that is not plain"),
    ("vaultAddress", "https://vault:8200/./x", "path prefix that is not plain"),
    ("vaultAddress", "https://vault:8200//x", "path prefix that is not plain"),
    ("vaultAddress", "https://vault:8200/a;b", "path prefix that is not plain"),
    ("baoAddress", "https://vault:8200/%2e%2e/sys", "percent-escape"),
    ("vaultAddress", "https://vault\\@evil/", "backslash"),
    ("vaultAddress", "https://vault:8200/a b", "a space"),
    ("vaultAddress", "https://vault:8200/\x00", "control character"),
    ("vaultAddress", "https://vault\uff1f.example", "non-ASCII"),
    ("vaultAddress", "https://vault:99999", "port that is not a number from 1 to 65535"),
    ("vaultAddress", "https://vault:x", "port that is not a number"),
    ("vaultAddress", "https://vault:8200:1", "several ':'"),
    ("vaultAddress", "https://[::1", "malformed bracketed IPv6"),
    ("vaultAddress", "https://:8200", "has no host"),
    ("openbaoAddress", "https://", "has no host"),
    ("vaultAddress", "vault:8200", "expected an http:// or https:// URL"),
]


@pytest.mark.parametrize(("key", "address", "needle"), REFUSED_ADDRESSES)
def test_store_address_takes_no_query_fragment_or_user_info(
    key: str, address: str, needle: str
) -> None:
    with pytest.raises(InvalidParameters) as info:
        parse({"roleName": "app", "objects": OBJECTS, key: address}, ONLINE)
    message = str(info.value)
    assert message.startswith(f"{key}: ") and needle in message
    assert "e.g. https://vault.example:8200" in message  # the fix
    assert "\n" not in message and "hunter2" not in message


@pytest.mark.parametrize(
    ("address", "stored"),
    [
        ("https://vault.example:8200", "https://vault.example:8200"),
        ("https://vault.example:8200/", "https://vault.example:8200"),
        ("http://10.0.0.7:8200", "http://10.0.0.7:8200"),
        ("https://[fd00::1]:8200", "https://[fd00::1]:8200"),
        ("http://[::1]", "http://[::1]"),
        # A path prefix: Vault behind a reverse proxy (upstream path.Joins it too).
        ("https://gateway.example/vault", "https://gateway.example/vault"),
        (
            "https://gateway.example/teams/a_b/vault-1.2~x/",
            "https://gateway.example/teams/a_b/vault-1.2~x",
        ),
        ("https://vault.example", "https://vault.example"),
    ],
)
def test_plain_addresses_and_path_prefixes_are_accepted(address: str, stored: str) -> None:
    assert store_of({"roleName": "app", "openbaoAddress": address}).address == stored


def test_provider_default_address_is_the_operators() -> None:
    # --vault-addr is the operator's, not a tenant's: only a class's own address is checked.
    ctx = ParseContext(options=Options(addr="https://vault.example:8200/ops"))
    assert store_of({"roleName": "app"}, ctx).address == "https://vault.example:8200/ops"


@pytest.mark.parametrize(
    ("key", "mount"),
    [
        ("vaultAuthMountPath", "kubernetes/login?"),
        ("vaultAuthMountPath", "jwt#"),
        ("vaultKubernetesMountPath", "../../sys/tools/random"),
        ("openbaoAuthMountPath", "a/./b"),
        ("baoAuthMountPath", "a//b"),
        ("vaultAuthMountPath", "%2e%2e/sys"),
        ("vaultAuthMountPath", "a\\b"),
        ("vaultAuthMountPath", "a b"),
        ("vaultAuthMountPath", "k\u00e9"),
    ],
)
def test_auth_mount_cannot_cut_or_climb_the_login_path(key: str, mount: str) -> None:
    with pytest.raises(InvalidParameters) as info:
        parse({"roleName": "app", "objects": OBJECTS, key: mount}, ONLINE)
    message = str(info.value)
    assert message.startswith(f"{key}: an auth mount path must not hold") and "\n" not in message


@pytest.mark.parametrize("mount", ["kubernetes", "clusters/prod", "/jwt/", "k8s_prod-1.a"])
def test_plain_auth_mounts_are_accepted(mount: str) -> None:
    assert store_of({"roleName": "app", "vaultAuthMountPath": mount}).mount == mount.strip("/")
