"""A vault selector's keys as a class gives them, and a server that is not a well-behaved Vault
(devkit/fakevault.py): names that would read elsewhere, listings that never end, answers that
are not Vault's, a secret deleted between its listing and its read, HashiCorp Vault's shape
without the detailed listing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import yaml
from aiohttp import web

from backends.vault.options import Options
from backends.vault.selectors import VaultSelection
from backends.vault.store import VaultBackend, create
from devkit.fakevault import FakeVault, json_ok, login_ok, status
from devkit.testing import fetch_ctx, make_env, make_pod
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    LimitExceeded,
    StoreUnavailable,
)
from provider.core.model import SecretValue
from provider.mount.planning import parse_plan
from tests.backends.vault.conftest import plan_for

POD_JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlLXRlc3Q"
LOGIN = ("POST", "auth/kubernetes/login")
MOUNT = ("GET", "sys/internal/ui/mounts/secret/app")
DETAILED = ("GET", "secret/detailed-metadata/app/")
KV2 = {"path": "secret/", "type": "kv", "options": {"version": "2"}}


@pytest.fixture
async def fake() -> AsyncIterator[FakeVault]:
    server = await FakeVault.start()
    server.on(*LOGIN, login_ok())
    server.on(*MOUNT, json_ok(KV2))
    yield server
    await server.stop()


@pytest.fixture
async def backend() -> AsyncIterator[VaultBackend]:
    vault = create(make_env("vault", Options()))
    assert isinstance(vault, VaultBackend)
    yield vault
    await vault.close()


async def select(
    backend: VaultBackend, fake: FakeVault, *, limit: int = 3, recursive: bool = False
) -> list[SecretValue] | BridgeError:
    objects = "- {objectName: x, secretPath: secret/data/x}"
    plan = plan_for(objects, vaultAddress=fake.addr, roleName="r")
    identity = await backend.identify(plan, make_pod(tokens={"vault": POD_JWT}))
    sel = VaultSelection("secret/app", 5 if recursive else 0, limit, recursive)
    got = (await backend.fetch(plan, identity, [sel], fetch_ctx(6)))[sel]
    return got if isinstance(got, BridgeError) else list(got)


def listing(keys: list[str], info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"keys": keys, "key_info": info or {k: meta(1) for k in keys if not k.endswith("/")}}


def meta(version: int, deleted: str = "") -> dict[str, Any]:
    state = {"created_time": "2030-01-01T00:00:00Z", "deletion_time": deleted, "destroyed": False}
    return {"current_version": version, "updated_time": "t", "versions": {str(version): state}}


def secret(value: str, version: int = 1) -> web.StreamResponse:
    data = {"data": {"v": value}, "metadata": {"version": version, "created_time": "c"}}
    return web.json_response({"request_id": "r", "data": data})


async def read(request: web.Request) -> web.StreamResponse:
    return secret(request.match_info["path"])


def reads(fake: FakeVault) -> int:
    """Secrets read (listings and the mount's answer are GETs too)."""
    return sum(n for (_, path), n in fake.calls.items() if path.startswith("secret/data/"))


@pytest.mark.parametrize("key", ["..", ".", "../", "a/../../b", "x\x00y"])
async def test_a_name_that_would_read_elsewhere_fails_the_selection_unread(
    fake: FakeVault, backend: VaultBackend, key: str
) -> None:
    fake.on(*DETAILED, json_ok(listing(["a", key])))
    got = await select(backend, fake, recursive=True)
    assert isinstance(got, InvalidParameters)
    assert "would read or write elsewhere than it names" in str(got)
    assert reads(fake) == 0


async def test_a_listing_that_pages_forever_ends_with_an_error(
    fake: FakeVault, backend: VaultBackend
) -> None:
    served = 0

    async def pages(request: web.Request) -> web.StreamResponse:
        # A full page of new folders every time (a non-recursive selector skips folders).
        nonlocal served
        size = int(request.query["limit"])
        keys = [f"f{served * size + i:08}/" for i in range(size)]
        served += 1
        return web.json_response({"data": {"keys": keys}})

    fake.on(*DETAILED, pages)
    got = await select(backend, fake)
    assert isinstance(got, StoreUnavailable) and not got.transient
    assert "listing did not end" in str(got)
    assert fake.calls[DETAILED] == 1 + 20  # the first page and 20 beyond it


async def test_a_listing_that_does_not_move_on_ends_at_its_second_page(
    fake: FakeVault, backend: VaultBackend
) -> None:
    async def same(request: web.Request) -> web.StreamResponse:
        size = int(request.query["limit"])
        return web.json_response({"data": {"keys": [f"f{i:04}/" for i in range(size)]}})

    fake.on(*DETAILED, same)
    got = await select(backend, fake)
    assert isinstance(got, StoreUnavailable) and "do not move on" in str(got)
    assert fake.calls[DETAILED] == 2


async def test_more_secrets_than_the_limit_stop_the_listing(
    fake: FakeVault, backend: VaultBackend
) -> None:
    fake.on(*DETAILED, json_ok(listing([f"s{i}" for i in range(8)])))
    got = await select(backend, fake, limit=3)
    assert isinstance(got, LimitExceeded) and "more than 3 secrets" in str(got)
    assert reads(fake) == 0


async def test_a_secret_deleted_between_listing_and_read_is_left_out(
    fake: FakeVault, backend: VaultBackend
) -> None:
    fake.on(*DETAILED, json_ok(listing(["a", "b"])))
    fake.on("GET", "secret/data/app/a", read)
    fake.on("GET", "secret/data/app/b", status(404))
    got = await select(backend, fake)
    assert isinstance(got, list) and [v.suffix for v in got] == ["a"]


async def test_deleted_and_destroyed_versions_are_not_read(
    fake: FakeVault, backend: VaultBackend
) -> None:
    destroyed = meta(2)
    destroyed["versions"]["2"]["destroyed"] = True
    info = {
        "a": meta(1),
        "gone": meta(3, deleted="2001-01-01T00:00:00Z"),
        "later": meta(1, deleted="2999-01-01T00:00:00Z"),  # deleted in the future: still here
        "dead": destroyed,
        "empty": {"current_version": 0},
    }
    fake.on(*DETAILED, json_ok(listing(list(info), info)))
    for key in ("a", "later"):
        fake.on("GET", f"secret/data/app/{key}", read)
    got = await select(backend, fake, limit=10)
    assert isinstance(got, list) and [v.suffix for v in got] == ["a", "later"]
    assert reads(fake) == 2


async def test_a_secret_written_after_its_listing_carries_the_version_it_was_read_at(
    fake: FakeVault, backend: VaultBackend
) -> None:
    fake.on(*DETAILED, json_ok(listing(["a"], {"a": meta(2)})))

    async def newer(_request: web.Request) -> web.StreamResponse:
        return secret("three", version=3)

    fake.on("GET", "secret/data/app/a", newer)
    got = await select(backend, fake)
    assert isinstance(got, list) and got[0].version == "3@c"


async def test_without_a_detailed_listing_the_metadata_listing_serves(
    fake: FakeVault, backend: VaultBackend
) -> None:
    # HashiCorp Vault has no detailed-metadata: "unsupported path" (or a policy's 403).
    fake.on(*DETAILED, status(404, errors=["1 error occurred:\n\t* unsupported path\n\n"]))
    fake.on("GET", "secret/metadata/app/", json_ok({"keys": ["a"]}))
    fake.on("GET", "secret/data/app/a", read)
    for _ in range(2):
        got = await select(backend, fake)
        assert isinstance(got, list) and [v.suffix for v in got] == ["a"]
        assert got[0].version is None  # no marker: the file's version is its content's HMAC
    assert fake.calls[DETAILED] == 1  # remembered with the mount
    assert fake.calls[("GET", "secret/metadata/app/")] == 2


async def test_a_path_under_another_engine_is_refused(
    fake: FakeVault, backend: VaultBackend
) -> None:
    fake.on(*MOUNT, json_ok({"path": "secret/", "type": "database"}))
    got = await select(backend, fake)
    assert isinstance(got, InvalidParameters) and "not KV" in str(got)


@pytest.mark.parametrize(
    "answer",
    [
        {"keys": "a"},
        {"keys": [1, 2]},
        None,
    ],
)
async def test_a_listing_that_is_not_vaults_fails_plainly(
    fake: FakeVault, backend: VaultBackend, answer: Any
) -> None:
    fake.on(*DETAILED, json_ok(answer))
    got = await select(backend, fake)
    assert isinstance(got, StoreUnavailable) and "not Vault's" in str(got)


async def test_a_mount_answer_for_another_path_is_refused(
    fake: FakeVault, backend: VaultBackend
) -> None:
    fake.on(*MOUNT, json_ok({"path": "elsewhere/", "type": "kv"}))
    got = await select(backend, fake)
    assert isinstance(got, StoreUnavailable) and "not Vault's" in str(got)


# -- the selector's keys --------------------------------------------------------------------


def plan(*selectors: Any, **params: str) -> Any:
    full = {
        "backend": "vault",
        "roleName": "app",
        "vaultAddress": "https://vault:8200",
        "select": yaml.safe_dump(list(selectors)),
        **params,
    }
    return parse_plan(full, options_for=None, enable_test_stores=False, max_objects=7)


def test_a_class_of_selectors_only_parses_and_names_them() -> None:
    parsed = plan({"path": "secret/app", "recursive": True, "directory": "app"})
    (spec,) = parsed.objects
    assert spec.ref == VaultSelection("secret/app", 5, 7, True)
    assert spec.ref.describe() == "KV secret/app/** (5 levels down)"
    assert spec.transforms.optional  # an empty selection is no error unless asked
    shallow = plan({"path": "/v1/kv1/team/", "directory": "t"}).objects[0].ref
    assert shallow == VaultSelection("kv1/team", 0, 7, False)
    assert (
        plan({"path": "secret/a", "recursive": "true", "depth": "10", "directory": "a"})
        .objects[0]
        .ref.depth
        == 10
    )


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"directory": "d"}, r"select\[0\]\.path is required"),
        ({"path": "secret/../x"}, r"select\[0\]\.path: expected a KV path"),
        ({"path": "secret//x"}, r"select\[0\]\.path: expected a KV path"),
        ({"path": "secret/x?list=true"}, r"select\[0\]\.path: expected a KV path"),
        ({"path": "secret/%2e%2e"}, r"select\[0\]\.path: expected a KV path"),
        ({"path": "s/" + "x" * 1100}, r"select\[0\]\.path: expected a KV path"),
        ({"path": "secret/a", "depth": 2}, r"select\[0\]\.depth: only a recursive selector"),
        ({"path": "secret/a", "recursive": True, "depth": 0}, r"select\[0\]\.depth: expected"),
        ({"path": "secret/a", "recursive": True, "depth": 11}, r"select\[0\]\.depth: expected"),
        ({"path": "secret/a", "recursive": True, "depth": True}, r"select\[0\]\.depth: expected"),
        ({"path": "secret/a", "recursive": "yes"}, r"select\[0\]\.recursive: expected"),
        ({"path": "secret/a", "recursve": True}, r"select\[0\]\.recursve is not a parameter"),
        ({"path": ["secret/a"]}, r"select\[0\]\.path: expected a string"),
    ],
)
def test_bad_selector_keys_are_refused_one_line_each(selector: Any, message: str) -> None:
    with pytest.raises(InvalidParameters, match=message):
        plan(selector)


def test_a_kv2_api_path_is_warned_about() -> None:
    parsed = plan({"path": "secret/data/app", "directory": "d"})
    assert any("reads like a KV version 2 API path" in w for w in parsed.warnings)


def test_a_class_without_objects_or_selectors_still_needs_objects() -> None:
    with pytest.raises(InvalidParameters, match="objects is required"):
        parse_plan(
            {"backend": "vault", "roleName": "app", "vaultAddress": "https://vault:8200"},
            options_for=None,
            enable_test_stores=False,
        )


async def test_a_revoked_token_is_replaced_once_and_the_listing_goes_on(
    fake: FakeVault, backend: VaultBackend
) -> None:
    ok = json_ok(listing(["a"]))
    fake.on(*DETAILED, ok, status(403, errors=["permission denied"]), ok)
    fake.on("GET", "secret/data/app/a", read)
    assert isinstance(await select(backend, fake), list)
    got = await select(backend, fake)  # the held token is refused: one new login
    assert isinstance(got, list) and [v.suffix for v in got] == ["a"]
    assert fake.calls[LOGIN] == 2 and fake.calls[DETAILED] == 3
    assert fake.calls[("GET", "secret/metadata/app/")] == 0  # still the detailed listing
