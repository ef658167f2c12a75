"""Whole Mounts through the core (composition root's Mounter) with the vault backend against
the real OpenBao: files as upstream writes them, object versions across rotation, one read per
unique request per mount, and isolation between service accounts with the value cache on."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends.vault.options import Options
from devkit.openbao import OpenBao
from devkit.testing import make_pod
from devkit.tokens import SigningKey
from provider.core.errors import MountFailed, PermissionDenied
from provider.core.metrics import Metrics
from provider.core.model import Pod
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import build_mounter
from provider.mount.mounting import MountInput, MountResult


class VaultMounts:
    def __init__(self, openbao: OpenBao, key: SigningKey, tmp_path: Path, **core: Any) -> None:
        self.openbao = openbao
        self.key = key
        hmac_key = tmp_path / "hmac"
        hmac_key.write_bytes(b"k" * 32)
        settings = ServeSettings(
            hmac_key_file=str(hmac_key),
            core=CoreSettings(**core),
            backend_options={"vault": Options(addr=openbao.addr)},
        )
        self.mounter, self.backends = build_mounter(settings, Metrics())

    def pod(self, namespace: str = "default", sa: str = "app") -> Pod:
        return make_pod(namespace, sa, tokens={"vault": self.key.pod_token(namespace, sa)})

    async def mount(self, objects: str, pod: Pod | None = None, **params: str) -> MountResult:
        full = {
            "backend": "vault",
            "roleName": "app",
            "vaultAuthMountPath": "jwt",
            "objects": objects,
            **params,
        }
        return await self.mounter.mount(MountInput(full, pod or self.pod(), permission=0o644))


@pytest.fixture
async def mounts(
    openbao: OpenBao, signing_key: SigningKey, tmp_path: Path
) -> AsyncIterator[VaultMounts]:
    harness = VaultMounts(openbao, signing_key, tmp_path)
    yield harness
    await harness.backends.close()


def by_path(result: MountResult) -> dict[str, bytes]:
    return {f.path: f.contents for f in result.files}


def versions(result: MountResult) -> dict[str, str]:
    return {v.id: v.version for v in result.versions}


OBJECTS = """
- objectName: username
  secretPath: secret/data/app/mount
  secretKey: username
- objectName: password
  secretPath: secret/data/app/mount
  secretKey: password
  filePermission: 0400
- objectName: port
  secretPath: secret/data/app/mount
  secretKey: port
- objectName: cert.der
  secretPath: secret/data/app/mount
  secretKey: cert
  encoding: base64
- objectName: whole.json
  secretPath: secret/data/app/mount
- objectName: first-user
  secretPath: kv1/app/users
  extract: users[0].name
"""


async def test_files_as_upstream_writes_them(mounts: VaultMounts, openbao: OpenBao) -> None:
    openbao.kv2_put(
        "secret",
        "app/mount",
        {
            "username": "app",
            "password": "pw",
            "port": 5432,
            "cert": base64.b64encode(b"\x00\x01binary").decode(),
        },
    )
    openbao.kv1_put("kv1", "app/users", {"users": [{"name": "ada"}, {"name": "bob"}]})
    result = await mounts.mount(OBJECTS)
    files = by_path(result)
    assert files["username"] == b"app"
    assert files["password"] == b"pw"
    assert files["port"] == b"5432"  # a non-string value is written as JSON
    assert files["cert.der"] == b"\x00\x01binary"
    assert json.loads(files["whole.json"])["data"]["data"]["username"] == "app"
    assert files["first-user"] == b"ada"
    modes = {f.path: f.mode for f in result.files}
    assert modes["password"] == 0o400 and modes["username"] == 0o644


async def test_one_read_per_unique_request_per_mount(mounts: VaultMounts, openbao: OpenBao) -> None:
    openbao.kv2_put(
        "secret", "app/mount", {"username": "a", "password": "b", "port": 1, "cert": ""}
    )
    openbao.kv1_put("kv1", "app/users", {"users": [{"name": "ada"}]})
    await mounts.mount(OBJECTS)  # the token is cached from here on
    openbao.audit_mark()
    await mounts.mount(OBJECTS)
    counts = openbao.audit_counts()
    # Five objects share one path: one read. One login per identity while its token lives.
    assert counts == {("read", "secret/data/app/mount"): 1, ("read", "kv1/app/users"): 1}


async def test_rotation_changes_exactly_the_rotated_versions(
    mounts: VaultMounts, openbao: OpenBao
) -> None:
    objects = """
- {objectName: rotating, secretPath: secret/data/app/rot, secretKey: v}
- {objectName: steady, secretPath: secret/data/app/steady, secretKey: v}
"""
    openbao.kv2_put("secret", "app/rot", {"v": "one"})
    openbao.kv2_put("secret", "app/steady", {"v": "same"})
    first = await mounts.mount(objects)
    again = await mounts.mount(objects)
    assert versions(again) == versions(first)
    openbao.kv2_put("secret", "app/rot", {"v": "two"})
    rotated = await mounts.mount(objects)
    assert by_path(rotated)["rotating"] == b"two"
    assert versions(rotated)["rotating"] != versions(first)["rotating"]
    assert versions(rotated)["steady"] == versions(first)["steady"]


async def test_whole_response_version_is_stable_while_the_secret_is(
    mounts: VaultMounts, openbao: OpenBao
) -> None:
    objects = "- {objectName: whole, secretPath: secret/data/app/whole}"
    openbao.kv2_put("secret", "app/whole", {"v": "x"})
    first, second = await mounts.mount(objects), await mounts.mount(objects)
    # Vault's request_id differs per read; it is left out so the version does not churn.
    assert versions(first) == versions(second)


async def test_unbound_pod_refused_after_allowed_pod_with_value_cache_on(
    openbao: OpenBao, signing_key: SigningKey, tmp_path: Path
) -> None:
    harness = VaultMounts(openbao, signing_key, tmp_path, cache_ttl=30)
    try:
        openbao.kv2_put("secret", "app/cached", {"v": "secret-value"})
        objects = "- {objectName: v, secretPath: secret/data/app/cached, secretKey: v}"
        assert by_path(await harness.mount(objects))["v"] == b"secret-value"
        with pytest.raises(PermissionDenied) as info:
            await harness.mount(objects, pod=harness.pod("default", "intruder"))
        assert "default/intruder" in str(info.value)
        assert "secret-value" not in str(info.value)
    finally:
        await harness.backends.close()


async def test_per_object_failures_are_gathered(mounts: VaultMounts, openbao: OpenBao) -> None:
    openbao.kv2_put("secret", "app/ok", {"v": "x"})
    objects = """
- {objectName: ok, secretPath: secret/data/app/ok, secretKey: v}
- {objectName: gone, secretPath: secret/data/app/never-written}
- {objectName: theirs, secretPath: secret/data/other/x}
"""
    with pytest.raises(MountFailed) as info:
        await mounts.mount(objects)
    text = str(info.value)
    for needle in ("'gone'", "'theirs'", "secret/data/other/x", "role 'app'", "default/app"):
        assert needle in text
    assert "'ok'" not in text


async def test_missing_secret_key_names_object_and_key(
    mounts: VaultMounts, openbao: OpenBao
) -> None:
    openbao.kv2_put("secret", "app/ok", {"v": "x"})
    objects = "- {objectName: nokey, secretPath: secret/data/app/ok, secretKey: missing}"
    with pytest.raises(MountFailed) as info:
        await mounts.mount(objects)
    assert "'nokey'" in str(info.value) and "missing" in str(info.value)
    assert "'x'" not in str(info.value)
