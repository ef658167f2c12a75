"""`select` on the vault backend against the real OpenBao, through the provider's own mounter:
KV v2 and KV v1 trees, the files and their names, secrets added, changed and deleted between
polls, and the store calls of each poll counted in OpenBao's audit log (and the provider's
backend_calls metric)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.vault.options import Options
from devkit.openbao import OpenBao
from devkit.testing import make_pod
from devkit.tokens import SigningKey
from provider.core.errors import InvalidParameters, LimitExceeded, MountFailed, PermissionDenied
from provider.core.metrics import Metrics
from provider.core.model import Pod
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import build_mounter
from provider.mount.mounting import MountInput, MountResult

#: The selecting role's grants: list and read under sel/, its metadata and detailed metadata,
#: one folder denied; the "plain" role may list only the metadata (HashiCorp Vault's shape).
SELECT_POLICY = """
path "secret/data/sel/*" { capabilities = ["read"] }
path "secret/metadata/sel/*" { capabilities = ["list"] }
path "secret/detailed-metadata/sel/*" { capabilities = ["list"] }
path "secret/data/sel/denied/*" { capabilities = ["deny"] }
path "kv1/sel/*" { capabilities = ["read", "list"] }
"""
PLAIN_POLICY = """
path "secret/data/sel/*" { capabilities = ["read"] }
path "secret/metadata/sel/*" { capabilities = ["list"] }
"""


@pytest.fixture(scope="module")
def roles(openbao: OpenBao) -> Iterator[None]:
    openbao.put_policy("select", SELECT_POLICY)
    openbao.put_policy("plainselect", PLAIN_POLICY)
    for role, policy in (("select", "select"), ("plainselect", "plainselect")):
        openbao.add_jwt_role(
            "jwt", role, namespace="default", service_account=role, policies=[policy]
        )
    yield


class Mounts:
    """The provider's mounter with the vault backend; each mount reads the store (no cache)."""

    def __init__(self, openbao: OpenBao, key: SigningKey, tmp_path: Path, **core: Any) -> None:
        self.openbao, self.key = openbao, key
        hmac_key = tmp_path / "hmac"
        hmac_key.write_bytes(b"k" * 32)
        settings = ServeSettings(
            hmac_key_file=str(hmac_key),
            core=CoreSettings(**core),
            backend_options={"vault": Options(addr=openbao.addr)},
        )
        self.metrics = Metrics()
        self.mounter, self.backends = build_mounter(settings, self.metrics)

    def pod(self, role: str) -> Pod:
        return make_pod("default", role, tokens={"vault": self.key.pod_token("default", role)})

    async def mount(
        self, *selectors: dict[str, Any], role: str = "select", **params: str
    ) -> MountResult:
        full = {"backend": "vault", "roleName": role, "vaultAuthMountPath": "jwt", **params}
        if selectors:
            full["select"] = yaml.safe_dump(list(selectors))
        return await self.mounter.mount(MountInput(full, self.pod(role), permission=0o644))

    async def files(self, *selectors: dict[str, Any], **params: str) -> dict[str, bytes]:
        return {f.path: f.contents for f in (await self.mount(*selectors, **params)).files}

    def calls(self) -> dict[str, int]:
        """The provider's store calls by operation (its backend_calls metric)."""
        out: dict[str, int] = {}
        for metric in self.metrics.backend_calls.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels["backend"] == "vault":
                    op = sample.labels["operation"]
                    out[op] = out.get(op, 0) + int(sample.value)
        return out


@pytest.fixture
async def mounts(
    openbao: OpenBao, signing_key: SigningKey, tmp_path: Path, roles: None
) -> AsyncIterator[Mounts]:
    harness = Mounts(openbao, signing_key, tmp_path)
    yield harness
    await harness.backends.close()


def values(files: dict[str, bytes]) -> dict[str, Any]:
    """Each file's KV data (the file is Vault's whole answer, as for an object)."""
    out = {}
    for path, content in files.items():
        data = json.loads(content)["data"]
        out[path] = data.get("data", data) if "metadata" in data else data
    return out


def kv2(openbao: OpenBao, secrets: dict[str, dict[str, Any]]) -> None:
    for path, data in secrets.items():
        openbao.kv2_put("secret", path, data)


def delete(openbao: OpenBao, path: str) -> None:
    openbao.root().secrets.kv.v2.delete_metadata_and_all_versions(path, mount_point="secret")


def detailed(folder: str) -> tuple[str, str]:
    return ("list", f"secret/detailed-metadata/{folder}/")


async def test_a_kv2_tree_polls_with_a_listing_per_folder_and_a_read_per_secret(
    mounts: Mounts, openbao: OpenBao
) -> None:
    kv2(
        openbao,
        {
            "sel/t1/a": {"v": "a"},
            "sel/t1/b": {"v": "b"},
            "sel/t1/sub/c": {"v": "c"},
            "sel/t1/sub/deep/d": {"v": "d"},
        },
    )
    chosen = {"path": "secret/sel/t1", "recursive": True, "directory": "app"}
    first = await mounts.files(chosen)
    assert values(first) == {
        "app/a": {"v": "a"},
        "app/b": {"v": "b"},
        "app/sub/c": {"v": "c"},
        "app/sub/deep/d": {"v": "d"},
    }
    # Unchanged: one listing per folder and every secret read again (a listing proves
    # permission to list, never to read), but not the mount (held 5 minutes).
    openbao.audit_mark()
    before = mounts.calls()
    assert await mounts.files(chosen) == first
    listings = {
        detailed("sel/t1"): 1,
        detailed("sel/t1/sub"): 1,
        detailed("sel/t1/sub/deep"): 1,
    }
    reads = {
        ("read", f"secret/data/sel/t1/{name}"): 1 for name in ("a", "b", "sub/c", "sub/deep/d")
    }
    assert openbao.audit_counts() == {**listings, **reads}
    assert mounts.calls()["list"] == before["list"] + 3
    # One changed, one added, one deleted: the listings, then each listed secret read (the
    # deleted one is not listed).
    kv2(openbao, {"sel/t1/b": {"v": "b2"}, "sel/t1/sub/e": {"v": "e"}})
    delete(openbao, "sel/t1/a")
    openbao.audit_mark()
    after = values(await mounts.files(chosen))
    assert after == {
        "app/b": {"v": "b2"},
        "app/sub/c": {"v": "c"},
        "app/sub/e": {"v": "e"},
        "app/sub/deep/d": {"v": "d"},
    }
    assert openbao.audit_counts() == {
        **listings,
        **{("read", f"secret/data/sel/t1/{n}"): 1 for n in ("b", "sub/c", "sub/e", "sub/deep/d")},
    }


async def test_the_first_read_finds_the_mount_lists_and_reads_each_secret(
    mounts: Mounts, openbao: OpenBao
) -> None:
    kv2(openbao, {"sel/t2/a": {"v": "a"}, "sel/t2/b": {"v": "b"}, "sel/t2/sub/c": {"v": "c"}})
    openbao.audit_mark()
    files = await mounts.files({"path": "secret/sel/t2", "directory": "t2"})
    assert sorted(files) == ["t2/a", "t2/b"]  # not recursive: the folder's own secrets
    assert openbao.audit_counts() == {
        ("update", "auth/jwt/login"): 1,
        ("read", "sys/internal/ui/mounts/secret/sel/t2"): 1,
        detailed("sel/t2"): 1,
        ("read", "secret/data/sel/t2/a"): 1,
        ("read", "secret/data/sel/t2/b"): 1,
    }


async def test_a_soft_deleted_secret_leaves_without_a_read(
    mounts: Mounts, openbao: OpenBao
) -> None:
    kv2(openbao, {"sel/t3/a": {"v": "a"}, "sel/t3/b": {"v": "b"}})
    chosen = {"path": "secret/sel/t3", "directory": "d"}
    assert sorted(await mounts.files(chosen)) == ["d/a", "d/b"]
    openbao.root().secrets.kv.v2.delete_latest_version_of_secret("sel/t3/a", mount_point="secret")
    openbao.audit_mark()
    assert sorted(await mounts.files(chosen)) == ["d/b"]
    # The listing says its latest version is deleted: only the other one is read.
    assert openbao.audit_counts() == {detailed("sel/t3"): 1, ("read", "secret/data/sel/t3/b"): 1}
    # Undeleted, it is back (read again: nothing of it was held).
    openbao.root().secrets.kv.v2.undelete_secret_versions("sel/t3/a", [1], mount_point="secret")
    assert sorted(await mounts.files(chosen)) == ["d/a", "d/b"]


async def test_a_new_version_and_new_custom_metadata_change_the_file_and_its_version(
    mounts: Mounts, openbao: OpenBao
) -> None:
    kv2(openbao, {"sel/t4/a": {"v": "1"}, "sel/t4/b": {"v": "same"}})
    chosen = {"path": "secret/sel/t4", "directory": "d"}
    first = await mounts.mount(chosen)
    kv2(openbao, {"sel/t4/a": {"v": "2"}})
    second = await mounts.mount(chosen)
    v1 = {v.id: v.version for v in first.versions}
    v2 = {v.id: v.version for v in second.versions}
    assert v1["d/a"] != v2["d/a"] and v1["d/b"] == v2["d/b"]
    openbao.root().secrets.kv.v2.update_metadata(
        "sel/t4/b", custom_metadata={"owner": "x"}, mount_point="secret"
    )
    third = await mounts.mount(chosen)
    b = next(f.contents for f in third.files if f.path == "d/b")
    assert json.loads(b)["data"]["metadata"]["custom_metadata"] == {"owner": "x"}
    assert {v.id: v.version for v in third.versions}["d/b"] != v2["d/b"]


async def test_selected_secrets_take_extraction_templates_and_odd_names(
    mounts: Mounts, openbao: OpenBao
) -> None:
    kv2(
        openbao,
        {
            "sel/t5/main": {"password": "p0"},
            "sel/t5/db main": {"password": "p1"},
            "sel/t5/q?x": {"password": "p2"},
            "sel/t5/pct%41": {"password": "p3"},
        },
    )
    chosen = {"path": "secret/sel/t5", "directory": "db", "extract": "password"}
    templates = "- path: both\n  template: 'main=${db/main}'\n"
    files = await mounts.files(chosen, templates=templates)
    # Each name as Vault has it: read by it percent-encoded, never as a query or an escape.
    assert files == {
        "db/main": b"p0",
        "db/db main": b"p1",
        "db/q?x": b"p2",
        "db/pct%41": b"p3",
        "both": b"main=p0",
    }


async def test_kv1_reads_every_secret_at_every_poll(mounts: Mounts, openbao: OpenBao) -> None:
    for path in ("sel/t6/a", "sel/t6/sub/b"):
        openbao.kv1_put("kv1", path, {"v": path})
    chosen = {"path": "kv1/sel/t6", "recursive": True, "directory": "d"}
    files = await mounts.files(chosen)
    assert values(files) == {"d/a": {"v": "sel/t6/a"}, "d/sub/b": {"v": "sel/t6/sub/b"}}
    openbao.audit_mark()
    again = await mounts.files(chosen)
    assert again == files
    assert openbao.audit_counts() == {
        ("list", "kv1/sel/t6/"): 1,
        ("list", "kv1/sel/t6/sub/"): 1,
        ("read", "kv1/sel/t6/a"): 1,
        ("read", "kv1/sel/t6/sub/b"): 1,
    }
    openbao.root().secrets.kv.v1.delete_secret("sel/t6/a", mount_point="kv1")
    openbao.kv1_put("kv1", "sel/t6/c", {"v": "c"})
    assert sorted(await mounts.files(chosen)) == ["d/c", "d/sub/b"]


async def test_without_the_detailed_listing_every_secret_is_read_at_every_poll(
    mounts: Mounts, openbao: OpenBao
) -> None:
    kv2(openbao, {"sel/t7/a": {"v": "a"}, "sel/t7/b": {"v": "b"}})
    chosen = {"path": "secret/sel/t7", "directory": "d"}
    files = await mounts.files(chosen, role="plainselect")
    assert sorted(files) == ["d/a", "d/b"]
    openbao.audit_mark()
    assert await mounts.files(chosen, role="plainselect") == files
    # The refused detailed listing is remembered with the mount: not asked again.
    assert openbao.audit_counts() == {
        ("list", "secret/metadata/sel/t7/"): 1,
        ("read", "secret/data/sel/t7/a"): 1,
        ("read", "secret/data/sel/t7/b"): 1,
    }
    delete(openbao, "sel/t7/a")
    assert sorted(await mounts.files(chosen, role="plainselect")) == ["d/b"]


async def test_an_optional_listed_object_missing_beside_a_selection(
    mounts: Mounts, openbao: OpenBao
) -> None:
    kv2(openbao, {"sel/t8/a": {"v": "a"}})
    objects = "- {objectName: gone, secretPath: secret/data/sel/t8-none, optional: true}"
    files = await mounts.files({"path": "secret/sel/t8", "directory": "s"}, objects=objects)
    assert sorted(files) == ["s/a"]


async def test_a_denied_secret_fails_the_selection(mounts: Mounts, openbao: OpenBao) -> None:
    kv2(openbao, {"sel/denied/x": {"v": "x"}, "sel/denied/y": {"v": "y"}})
    with pytest.raises(MountFailed, match=r"reading secret/data/sel/denied/x .* denied") as info:
        await mounts.files({"path": "secret/sel/denied", "directory": "d"})
    assert isinstance(info.value.failures[0][1], PermissionDenied)


async def test_a_listing_denied_fails_the_selection(mounts: Mounts, openbao: OpenBao) -> None:
    kv2(openbao, {"other/x": {"v": "x"}})
    pattern = r"listing secret/metadata/other/ .* denied .* grant the role list on"
    with pytest.raises(MountFailed, match=pattern) as info:
        await mounts.files({"path": "secret/other", "directory": "d"})
    assert isinstance(info.value.failures[0][1], PermissionDenied)


async def test_a_selection_over_max_objects_is_refused_naming_the_limit(
    openbao: OpenBao, signing_key: SigningKey, tmp_path: Path, roles: None
) -> None:
    kv2(openbao, {f"sel/t9/s{i}": {"v": i} for i in range(5)})
    harness = Mounts(openbao, signing_key, tmp_path, max_objects=3)
    try:
        with pytest.raises(MountFailed, match=r"more than 3 secrets, over .* limit of 3") as info:
            await harness.files({"path": "secret/sel/t9", "directory": "d"})
        assert isinstance(info.value.failures[0][1], LimitExceeded)
        # Folders count too: five folders of one secret each under a limit of 3.
        kv2(openbao, {f"sel/t9f/f{i}/s": {"v": i} for i in range(5)})
        with pytest.raises(MountFailed, match="more than 3 folders"):
            await harness.files({"path": "secret/sel/t9f", "recursive": True, "directory": "d"})
    finally:
        await harness.backends.close()


async def test_a_folder_over_one_page_is_listed_page_after_page(
    openbao: OpenBao, signing_key: SigningKey, tmp_path: Path, roles: None
) -> None:
    # Under a limit of 3 a page is 2 x 3 + 2 keys: 3 secrets and 10 folders take two pages,
    # the second one after an odd name.
    secrets = {"sel/t13/a b": {"v": 1}, "sel/t13/q?x": {"v": 2}, "sel/t13/z%41": {"v": 3}}
    kv2(openbao, {**secrets, **{f"sel/t13/q?{i}/s": {"v": i} for i in range(10)}})
    harness = Mounts(openbao, signing_key, tmp_path, max_objects=3)
    try:
        openbao.audit_mark()
        files = await harness.files({"path": "secret/sel/t13", "directory": "d"})
        assert sorted(files) == ["d/a b", "d/q?x", "d/z%41"]
        assert openbao.audit_counts()[detailed("sel/t13")] == 2
    finally:
        await harness.backends.close()


async def test_a_large_folder_is_refused_after_one_page(
    openbao: OpenBao, signing_key: SigningKey, tmp_path: Path, roles: None
) -> None:
    client = openbao.root()
    for i in range(400):
        client.secrets.kv.v2.create_or_update_secret(
            f"sel/big/s{i:04}", {"v": i}, mount_point="secret"
        )
    harness = Mounts(openbao, signing_key, tmp_path, max_objects=100)
    try:
        openbao.audit_mark()
        started = time.monotonic()
        with pytest.raises(MountFailed, match=r"more than 100 secrets"):
            await harness.files({"path": "secret/sel/big", "directory": "d"})
        assert time.monotonic() - started < 5
        counts = openbao.audit_counts()
        # One page of 2 x 100 + 2 keys decides it; no secret is read.
        assert counts[detailed("sel/big")] == 1
        assert not [path for (op, path) in counts if op == "read" and "/data/" in path]
    finally:
        await harness.backends.close()


async def test_names_that_collide_are_refused_with_both(mounts: Mounts, openbao: OpenBao) -> None:
    kv2(openbao, {"sel/t10/x": {"v": "file"}, "sel/t10/x/y": {"v": "under"}})
    with pytest.raises(InvalidParameters, match=r"'c/x'.*'c/x/y'|'c/x/y'.*'c/x'"):
        await mounts.files({"path": "secret/sel/t10", "recursive": True, "directory": "c"})


async def test_a_folder_deeper_than_the_depth_fails_naming_it(
    mounts: Mounts, openbao: OpenBao
) -> None:
    kv2(openbao, {"sel/t11/a/b/c": {"v": "deep"}})
    with pytest.raises(MountFailed, match=r"'secret/sel/t11/a/b' is deeper than .* depth of 1"):
        await mounts.files(
            {"path": "secret/sel/t11", "recursive": True, "depth": 1, "directory": "d"}
        )
    files = await mounts.files(
        {"path": "secret/sel/t11", "recursive": True, "depth": 2, "directory": "d"}
    )
    assert sorted(files) == ["d/a/b/c"]


async def test_an_empty_selection_is_no_error_unless_asked(
    mounts: Mounts, openbao: OpenBao
) -> None:
    kv2(openbao, {"sel/t12/a": {"v": "a"}})
    files = await mounts.files(
        {"path": "secret/sel/t12", "directory": "d"}, {"path": "secret/sel/none", "directory": "n"}
    )
    assert sorted(files) == ["d/a"]
    with pytest.raises(MountFailed, match=r"select\[1\]: no secret matches it"):
        await mounts.files(
            {"path": "secret/sel/t12", "directory": "d"},
            {"path": "secret/sel/none", "directory": "n", "optional": False},
        )


async def test_a_refresh_interval_reuses_the_values_then_reads_again(
    openbao: OpenBao, signing_key: SigningKey, tmp_path: Path, roles: None
) -> None:
    """`refreshInterval` against the real store: within it a poll makes no store call; after
    it the poll reads (the selection's listing, the listed object) again."""
    harness = Mounts(openbao, signing_key, tmp_path, min_refresh_interval=0.0)
    try:
        kv2(openbao, {"sel/r/a": {"v": "1"}, "sel/r/x": {"v": "x"}})
        listed = yaml.safe_dump([{"objectName": "x", "secretPath": "secret/data/sel/r/x"}])
        chosen = {"path": "secret/sel/r", "directory": "r"}
        policy = {"objects": listed, "refreshInterval": "1s"}
        first = await harness.files(chosen, **policy)
        assert set(first) == {"x", "r/a", "r/x"}
        kv2(openbao, {"sel/r/a": {"v": "2"}})
        openbao.audit_mark()
        assert values(await harness.files(chosen, **policy))["r/a"] == {"v": "1"}
        assert openbao.audit_counts() == {}  # reused: not one call to the store
        time.sleep(1.1)
        assert values(await harness.files(chosen, **policy))["r/a"] == {"v": "2"}
        counts = openbao.audit_counts()
        # "x" twice: once as the listed object, once as a selected secret.
        assert counts[detailed("sel/r")] == 1 and counts[("read", "secret/data/sel/r/x")] == 2
        # Past the window every selected secret is read again, changed ("a") or not ("x").
        assert counts[("read", "secret/data/sel/r/a")] == 1
    finally:
        await harness.backends.close()
