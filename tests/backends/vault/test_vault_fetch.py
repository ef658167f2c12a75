"""The vault backend against a real OpenBao server: jwt and kubernetes auth, KV v1/v2, versions,
a POST path, denials, and request counts taken from OpenBao's audit log."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Hashable, Mapping
from pathlib import Path

import pytest

from backends.vault.options import Options
from backends.vault.store import VaultBackend, create
from devkit.kube import TokenReviewStub
from devkit.openbao import OpenBao
from devkit.testing import fetch_ctx, make_env, make_pod
from devkit.tokens import SigningKey
from provider.core.errors import MissingCredential, NotFound, PermissionDenied, StoreUnavailable
from provider.core.model import Identity, SecretValue, StorePlan
from tests.backends.vault.conftest import plan_for


def jwt_class(openbao: OpenBao, objects: str, **params: str) -> StorePlan:
    defaults = {"vaultAddress": openbao.addr, "roleName": "app", "vaultAuthMountPath": "jwt"}
    return plan_for(objects, **{**defaults, **params})


def app_pod(key: SigningKey, namespace: str = "default", sa: str = "app", aud: str = "vault"):  # type: ignore[no-untyped-def]
    return make_pod(namespace, sa, tokens={aud: key.pod_token(namespace, sa, aud)})


async def fetch_all(
    backend: VaultBackend, plan: StorePlan, identity: Identity
) -> Mapping[Hashable, object]:
    refs = list(dict.fromkeys(spec.ref for spec in plan.objects))
    return await backend.fetch(plan, identity, refs, fetch_ctx())


def only_value(fetched: object) -> SecretValue:
    assert isinstance(fetched, list), fetched
    (value,) = fetched
    assert isinstance(value, SecretValue)
    return value


async def read_one(backend: VaultBackend, plan: StorePlan, key: SigningKey) -> object:
    identity = await backend.identify(plan, app_pod(key))
    results = await fetch_all(backend, plan, identity)
    return results[plan.objects[0].ref]


async def test_kv2_read_gives_the_whole_response_and_the_data_map(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    openbao.kv2_put("secret", "app/db", {"username": "app", "password": "s3cret", "n": 1})
    plan = jwt_class(
        openbao, "- {objectName: db, secretPath: secret/data/app/db, secretKey: password}"
    )
    value = only_value(await read_one(backend, plan, signing_key))
    whole = json.loads(value.content)
    # Upstream writes the whole JSON answer; we leave out only the per-request id.
    assert whole["data"]["data"]["password"] == "s3cret"
    assert "request_id" not in whole
    assert value.view() == {"username": "app", "password": "s3cret", "n": 1}
    assert value.version is None


async def test_kv1_read_data_is_the_secret(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    openbao.kv1_put("kv1", "app/api", {"token": "abc", "data": "not-a-map"})
    plan = jwt_class(openbao, "- {objectName: api, secretPath: kv1/app/api}")
    value = only_value(await read_one(backend, plan, signing_key))
    assert value.view() == {"token": "abc", "data": "not-a-map"}
    assert json.loads(value.content)["data"]["token"] == "abc"


async def test_versions_and_rotation(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    first = openbao.kv2_put("secret", "app/rotating", {"v": "one"})
    plan = jwt_class(openbao, "- {objectName: r, secretPath: secret/data/app/rotating}")
    pinned = jwt_class(
        openbao, f"- {{objectName: r, secretPath: 'secret/data/app/rotating?version={first}'}}"
    )
    before = only_value(await read_one(backend, plan, signing_key))
    again = only_value(await read_one(backend, plan, signing_key))
    # Unchanged secret, unchanged content: the core's object version stays stable.
    assert again.content == before.content
    openbao.kv2_put("secret", "app/rotating", {"v": "two"})
    after = only_value(await read_one(backend, plan, signing_key))
    assert after.view() == {"v": "two"}
    assert after.content != before.content
    old = only_value(await read_one(backend, pinned, signing_key))
    assert old.view() == {"v": "one"}


async def test_post_with_args_reads_a_dynamic_style_path(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    text = b"hello vault"
    args = {"input": base64.b64encode(text).decode(), "format": "hex"}
    objects = (
        f"- {{objectName: sum, secretPath: sys/tools/hash/sha2-256, method: POST, "
        f"secretArgs: {json.dumps(args)}, secretKey: sum}}"
    )
    value = only_value(await read_one(backend, jwt_class(openbao, objects), signing_key))
    assert value.view()["sum"] == hashlib.sha256(text).hexdigest()


async def test_kubernetes_auth_through_token_review(
    openbao: OpenBao, signing_key: SigningKey, token_review: TokenReviewStub, backend: VaultBackend
) -> None:
    openbao.kv2_put("secret", "app/k8s", {"k": "v"})
    # No mount given: the default is `kubernetes`, like upstream.
    plan = plan_for(
        "- {objectName: k, secretPath: secret/data/app/k8s}",
        vaultAddress=openbao.addr,
        roleName="app",
    )
    reviews = token_review.reviews
    value = only_value(await read_one(backend, plan, signing_key))
    assert value.view() == {"k": "v"}
    assert token_review.reviews == reviews + 1


async def test_unbound_service_account_is_refused_right_after_an_allowed_pod(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    openbao.kv2_put("secret", "app/shared", {"k": "v"})
    plan = jwt_class(openbao, "- {objectName: s, secretPath: secret/data/app/shared}")
    only_value(await read_one(backend, plan, signing_key))
    intruder = app_pod(signing_key, namespace="default", sa="intruder")
    identity = await backend.identify(plan, intruder)
    with pytest.raises(PermissionDenied) as info:
        await fetch_all(backend, plan, identity)
    text = str(info.value)
    for needle in ("default/intruder", "role 'app'", "auth/jwt", "audience 'vault'", "not bound"):
        assert needle in text
    token = intruder.tokens["vault"].token
    assert token not in text


async def test_wrong_audience_login_names_the_likely_cause(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    plan = jwt_class(openbao, "- {objectName: s, secretPath: secret/data/app/x}", audience="other")
    pod = app_pod(signing_key, aud="other")
    with pytest.raises(
        PermissionDenied, match=r"audience 'other'.*likely cause: the role does not accept"
    ):
        await fetch_all(backend, plan, await backend.identify(plan, pod))


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"roleName": "ghost"}, "there is no role 'ghost' at auth/jwt"),
        ({"vaultAuthMountPath": "nowhere"}, "no auth method is mounted at auth/nowhere"),
    ],
)
async def test_login_denials(
    openbao: OpenBao,
    signing_key: SigningKey,
    backend: VaultBackend,
    params: dict[str, str],
    needle: str,
) -> None:
    plan = jwt_class(openbao, "- {objectName: s, secretPath: secret/data/app/x}", **params)
    with pytest.raises(PermissionDenied, match=needle):
        await fetch_all(backend, plan, await backend.identify(plan, app_pod(signing_key)))


async def test_missing_token_is_refused_before_any_request(
    openbao: OpenBao, backend: VaultBackend
) -> None:
    plan = jwt_class(openbao, "- {objectName: s, secretPath: secret/data/app/x}")
    openbao.audit_mark()
    with pytest.raises(MissingCredential, match="'vault'"):
        await backend.identify(plan, make_pod(tokens={"other": "x"}))
    assert sum(openbao.audit_counts().values()) == 0


async def test_denied_path_and_not_found_are_per_object(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    openbao.kv2_put("secret", "other/db", {"k": "v"})
    objects = """
- {objectName: forbidden, secretPath: secret/data/other/db}
- {objectName: missing, secretPath: secret/data/app/does-not-exist}
- {objectName: v1style, secretPath: secret/app/db}
- {objectName: v1denied, secretPath: secret/other/db}
"""
    plan = jwt_class(openbao, objects)
    identity = await backend.identify(plan, app_pod(signing_key))
    openbao.audit_mark()
    results = await fetch_all(backend, plan, identity)
    forbidden, missing, v1style, v1denied = (results[s.ref] for s in plan.objects)
    assert isinstance(forbidden, PermissionDenied)
    for needle in (
        "object 'forbidden'",
        "secret/data/other/db",
        "role 'app'",
        "auth/jwt",
        "default/app",
    ):
        assert needle in str(forbidden)
    assert isinstance(missing, NotFound)
    assert "secret/data/app/does-not-exist" in str(missing)
    assert isinstance(v1style, NotFound)
    assert "use secretPath secret/data/app/db" in str(v1style)
    assert isinstance(v1denied, PermissionDenied)
    assert "KV version 2 mount, read secretPath secret/data/other/db" in str(v1denied)
    counts = openbao.audit_counts()
    # A fresh token's 403 is a real denial: no second login for it.
    assert counts[("update", "auth/jwt/login")] == 1
    assert counts[("read", "secret/data/other/db")] == 1


async def test_one_login_per_identity_and_one_read_per_unique_request(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    openbao.kv2_put("secret", "app/creds", {"username": "u", "password": "p"})
    objects = """
- {objectName: user, secretPath: secret/data/app/creds, secretKey: username}
- {objectName: pass, secretPath: secret/data/app/creds, secretKey: password}
- objectName: hash-a
  secretPath: sys/tools/hash/sha2-256
  method: POST
  secretArgs: {input: aGk=, format: hex}
  secretKey: sum
- objectName: hash-b
  secretPath: sys/tools/hash/sha2-256
  method: post
  secretArgs: {format: hex, input: aGk=}
- objectName: hash-c
  secretPath: sys/tools/hash/sha2-256
  method: POST
  secretArgs: {input: aG8=, format: hex}
"""
    plan = jwt_class(openbao, objects)
    openbao.audit_mark()
    for _ in range(3):
        identity = await backend.identify(plan, app_pod(signing_key))
        results = await fetch_all(backend, plan, identity)
        assert all(isinstance(r, list) for r in results.values()), results
    counts = openbao.audit_counts()
    assert counts[("update", "auth/jwt/login")] == 1
    assert counts[("read", "secret/data/app/creds")] == 3
    # hash-a and hash-b are one request (same args in another order); hash-c is another.
    assert counts[("update", "sys/tools/hash/sha2-256")] == 3 * 2
    # Another identity logs in by itself.
    other_plan = jwt_class(openbao, "- {objectName: o, secretPath: secret/data/app/creds}")
    other_key = (await backend.identify(other_plan, app_pod(signing_key))).key
    assert other_key == identity.key
    await backend.identify(
        plan, make_pod(service_account="app", uid="uid-1", tokens={"vault": "x"})
    )
    assert openbao.audit_counts()[("update", "auth/jwt/login")] == 1


async def test_revoked_token_triggers_one_shared_relogin(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    openbao.kv2_put("secret", "app/r1", {"k": "1"})
    objects = "\n".join(
        f"- {{objectName: o{i}, secretPath: 'secret/data/app/r1?version=1&n={i}'}}"
        for i in range(5)
    )
    plan = jwt_class(openbao, objects)
    identity = await backend.identify(plan, app_pod(signing_key))
    await fetch_all(backend, plan, identity)
    # Revoke every token issued through auth/jwt: the cached one now gets 403.
    openbao.root().sys.revoke_prefix("auth/jwt/login")
    openbao.audit_mark()
    results = await fetch_all(backend, plan, identity)
    assert all(isinstance(r, list) for r in results.values()), results
    counts = openbao.audit_counts()
    assert counts[("update", "auth/jwt/login")] == 1
    assert counts[("read", "secret/data/app/r1")] == 10  # 5 refused, 5 served


async def test_identity_keys_separate_service_accounts_and_settings(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    plan = jwt_class(openbao, "- {objectName: s, secretPath: secret/data/app/x}")
    a = await backend.identify(plan, app_pod(signing_key))
    b = await backend.identify(plan, app_pod(signing_key, sa="other"))
    c = await backend.identify(
        jwt_class(openbao, "- {objectName: s, secretPath: a/b}", roleName="r2"),
        app_pod(signing_key),
    )
    assert len({a.key, b.key, c.key}) == 3
    token = app_pod(signing_key).tokens["vault"].token
    assert token not in a.key and "default/app" in a.key


async def test_concurrent_fetches_share_one_login(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    openbao.kv2_put("secret", "app/burst", {"k": "v"})
    plan = jwt_class(
        openbao, "- {objectName: s, secretPath: secret/data/app/burst}", roleName="app"
    )
    pods = [app_pod(signing_key) for _ in range(20)]
    identities = [await backend.identify(plan, p) for p in pods]
    openbao.audit_mark()
    await asyncio.gather(*(fetch_all(backend, plan, i) for i in identities))
    assert openbao.audit_counts()[("update", "auth/jwt/login")] == 1


async def test_openbao_spellings_default_to_the_openbao_audience(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    openbao.add_jwt_role(
        "jwt",
        "bao-app",
        namespace="default",
        service_account="app",
        policies=["app"],
        audience="openbao",
    )
    openbao.kv2_put("secret", "app/bao", {"k": "bao"})
    plan = plan_for(
        "- {objectName: b, secretPath: secret/data/app/bao, secretKey: k}",
        openbaoAddress=openbao.addr,
        openbaoRoleName="bao-app",
        openbaoAuthMountPath="jwt",
    )
    pod = make_pod(tokens={"openbao": signing_key.pod_token("default", "app", "openbao")})
    identity = await backend.identify(plan, pod)
    value = only_value((await fetch_all(backend, plan, identity))[plan.objects[0].ref])
    assert value.view() == {"k": "bao"}


async def test_sealed_openbao_is_unavailable_and_recovers(
    signing_key: SigningKey, tmp_path: Path
) -> None:
    server = OpenBao.start(tmp_path / "sealed")
    vault = create(make_env("vault", Options(addr=server.addr)))
    try:
        server.put_policy("app", 'path "secret/data/app/*" { capabilities = ["read"] }')
        server.configure_jwt_auth("jwt", signing_key.public_pem)
        server.add_jwt_role(
            "jwt", "app", namespace="default", service_account="app", policies=["app"]
        )
        server.kv2_put("secret", "app/s", {"k": "v"})
        plan = jwt_class(server, "- {objectName: s, secretPath: secret/data/app/s}")
        identity = await vault.identify(plan, app_pod(signing_key))
        await fetch_all(vault, plan, identity)  # token cached
        server.seal()
        results = await vault.fetch(plan, identity, [plan.objects[0].ref], fetch_ctx(1.5))
        error = results[plan.objects[0].ref]
        assert isinstance(error, StoreUnavailable) and error.transient
        assert "sealed" in str(error) and "object 's'" in str(error)
        server.unseal()
        # Sealing revoked nothing in dev mode's in-memory store; reads resume.
        assert isinstance((await fetch_all(vault, plan, identity))[plan.objects[0].ref], list)
    finally:
        await vault.close()
        server.stop()


async def test_kubernetes_auth_refuses_an_unbound_service_account(
    openbao: OpenBao, signing_key: SigningKey, backend: VaultBackend
) -> None:
    plan = plan_for(
        "- {objectName: k, secretPath: secret/data/app/k8s}",
        vaultAddress=openbao.addr,
        roleName="app",
    )
    pod = app_pod(signing_key, namespace="default", sa="stranger")
    with pytest.raises(PermissionDenied) as info:
        await fetch_all(backend, plan, await backend.identify(plan, pod))
    assert "auth/kubernetes" in str(info.value) and "not bound to service account" in str(
        info.value
    )
