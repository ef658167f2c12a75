"""Classes of several stores (docs/multi-store.md): parsing through each store's own dialect,
and the mount's rules on the fake store (fast; the real stores are in
tests/e2e/test_e2e_multistore.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.testing import Harness, make_pod
from provider.core.errors import InvalidParameters, MountFailed, NotFound, StoreUnavailable
from provider.mount.mounting import MountInput
from provider.mount.planning import MountPlan, parse_plan

TENANT = "11111111-2222-3333-4444-555555555555"
STORES = {
    "vault": {"backend": "vault", "roleName": "app", "vaultAddress": "https://vault:8200"},
    "gsm": {"backend": "gcp"},
    "kv": {"backend": "azure", "keyvaultName": "payments-kv", "tenantID": TENANT},
}


def plan(objects: list[Any], stores: dict[str, Any] | None = None, **extra: str) -> MountPlan:
    params = {
        "stores": yaml.safe_dump(STORES if stores is None else stores, sort_keys=False),
        "objects": yaml.safe_dump(objects),
        **extra,
    }
    return parse_plan(params, options_for=None, enable_test_stores=True)


def problems(objects: list[Any], stores: dict[str, Any] | None = None, **extra: str) -> list[str]:
    with pytest.raises(InvalidParameters) as info:
        plan(objects, stores, **extra)
    return info.value.problems


def test_each_store_parses_its_entries_in_its_own_dialect() -> None:
    got = plan(
        [
            {"store": "vault", "objectName": "db", "secretPath": "secret/data/db"},
            {"store": "gsm", "resourceName": "projects/p/secrets/ca/versions/3", "path": "ca"},
            {"store": "kv", "objectName": "tls", "objectType": "cert", "filePermission": "0400"},
        ],
        templates="- {path: app.env, format: env, objects: [db, tls]}",
    )
    assert got.named and got.backend == "multi"
    assert [(s.name, s.plan.backend) for s in got.stores] == [
        ("vault", "vault"),
        ("gsm", "gcp"),
        ("kv", "azure"),
    ]
    # Fields name each entry by its place in the class's one list.
    assert [(o.name, o.field, o.mode) for o in got.objects] == [
        ("db", "objects[0].objectName", None),
        ("ca", "objects[1].path", None),
        ("tls", "objects[2].objectName", 0o400),
    ]
    # Upstream's ObjectVersion ids, per dialect.
    assert [o.version_id for o in got.objects] == [
        "",
        "projects/p/secrets/ca/versions/3",
        "cert/tls",
    ]
    assert [t.path for t in got.templates] == ["app.env"]
    with pytest.raises(ValueError, match="several stores"):
        _ = got.store


def test_a_backend_class_is_one_unnamed_store() -> None:
    params = {"backend": "fake", "objects": "- objectName: a"}
    got = parse_plan(params, options_for=None, enable_test_stores=True)
    assert not got.named and got.backend == "fake" and got.store.objects[0].name == "a"


@pytest.mark.parametrize(
    ("objects", "stores", "expected"),
    [
        (
            [{"objectName": "a"}],
            None,
            [
                "objects[0].store is required: the name of one of the class's stores "
                "(vault, gsm, kv)"
            ],
        ),
        (
            [{"store": "aws", "objectName": "a"}],
            None,
            ["objects[0].store: 'aws' is not one of the class's stores (vault, gsm, kv)"],
        ),
        (
            [{"store": "vault", "objectName": "a"}, {"store": "kv", "objectName": "b"}],
            None,
            [
                "store 'vault': objects[0].secretPath is required",
                "store 'kv': objects[1].objectType: expected secret, key or cert, got 'nothing'",
            ],
        ),
        (
            [{"store": "vault", "objectName": "a", "secretPath": "s"}],
            {"vault": {"roleName": "app"}},
            ["parameter 'stores.vault.backend' is missing"],
        ),
        (
            [
                {"store": "one", "objectName": "a"},
                {"store": "two", "objectName": "a"},
            ],
            {"one": {"backend": "fake"}, "two": {"backend": "fake"}},
            [
                "file name 'a' is used by objects[0].objectName (store 'one'), "
                "objects[1].objectName (store 'two'); names must be unique"
            ],
        ),
        (
            [{"store": "one", "objectName": "a", "fallback": {"store": "two", "objectName": "b"}}],
            {"one": {"backend": "fake"}, "two": {"backend": "fake"}},
            ["objects[0].fallback writes 'b', the object 'a': a fallback must write the same"],
        ),
        (
            [{"store": "one", "objectName": "a", "fallback": {"objectName": "a"}}],
            {"one": {"backend": "fake"}},
            ["objects[0].fallback.store is required"],
        ),
        (
            [{"store": "one", "objectName": "a"}],
            {"one": {"backend": "fake", "objects": "- objectName: b"}},
            ["stores.one.objects: objects belongs to the class, not to a store"],
        ),
        (
            ["objectName: a"],
            {"one": {"backend": "fake"}},
            ["objects[0]: expected a map: `store: <name>` and that store's object keys"],
        ),
    ],
)
def test_problems_name_the_store_and_the_entry(
    objects: list[Any], stores: dict[str, Any] | None, expected: list[str]
) -> None:
    found = problems(objects, stores)
    for message in expected:
        assert any(p.startswith(message) for p in found), (message, found)


def test_backend_and_stores_are_exclusive() -> None:
    assert problems(
        [{"store": "one", "objectName": "a"}], {"one": {"backend": "fake"}}, backend="fake"
    ) == [
        "the class gives both backend and stores: set backend for a class of one store, or "
        "stores (with `store:` on every object) for several, not both"
    ]


def test_warnings_for_an_unused_store_and_a_stray_parameter() -> None:
    got = plan(
        [{"store": "one", "objectName": "a"}],
        {"one": {"backend": "fake", "audiance": "x"}, "spare": {"backend": "fake"}},
        roleName="app",
    )
    assert [s.name for s in got.stores] == ["one"]
    assert got.warnings == (
        "store 'spare' is not used by any object (remove it, or add objects)",
        "store 'one': parameter 'audiance' is not used by the fake backend",
        "parameter 'roleName' is not used by a class of several stores (a typo?)",
    )


def test_the_object_limit_counts_every_store() -> None:
    stores = {"one": {"backend": "fake"}, "two": {"backend": "fake"}}
    objects = [{"store": ("one", "two")[i % 2], "objectName": f"o{i}"} for i in range(6)]
    with pytest.raises(InvalidParameters, match="asks for 6 objects"):
        parse_plan(
            {"stores": yaml.safe_dump(stores), "objects": yaml.safe_dump(objects)},
            options_for=None,
            enable_test_stores=True,
            max_objects=5,
        )


# -- mounts on the fake store --------------------------------------------------------------------

FAKES = yaml.safe_dump({"new": {"backend": "fake"}, "old": {"backend": "fake", "audience": "o"}})
MOVED = {"store": "new", "objectName": "key", "fallback": {"store": "old", "objectName": "key"}}


def mount_input(objects: list[Any], tokens: dict[str, str] | None = None) -> MountInput:
    params = {"stores": FAKES, "objects": yaml.safe_dump(objects)}
    return MountInput(params=params, pod=make_pod(tokens=tokens or {"o": "t"}), permission=0o644)


async def test_fallback_on_not_found_only(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    # One fake store behind both names: "new" reads `new-key`, which it does not hold.
    h.write({"secrets": {"key": "old-value"}})
    result = await h.mounter.mount(mount_input([{**MOVED, "secretPath": "new-key"}]))
    assert {f.path: f.contents for f in result.files} == {"key": b"old-value"}
    value = h.metrics.fallback_reads.labels("fake", "ok")._value.get()
    assert value == 1
    h.write({"secrets": {"key": "old-value"}, "failures": {"new-key": "unavailable"}})
    with pytest.raises(MountFailed) as info:
        await h.mounter.mount(mount_input([{**MOVED, "secretPath": "new-key"}]))
    ((name, cause),) = info.value.failures
    assert name == "key" and isinstance(cause, StoreUnavailable)
    assert str(cause).startswith("object 'key': in store 'new': fake store: 'new-key' is unavail")
    assert h.metrics.fallback_reads.labels("fake", "ok")._value.get() == 1
    await h.backends.close()


async def test_a_failed_fallback_names_both_stores(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {}})
    with pytest.raises(MountFailed) as info:
        await h.mounter.mount(mount_input([{**MOVED, "secretPath": "new-key"}]))
    ((_, cause),) = info.value.failures
    assert isinstance(cause, NotFound)
    assert str(cause) == (
        "object 'key': in store 'new': fake store: no secret at 'new-key'; its fallback in "
        "store 'old': fake store: no secret at 'key'"
    )
    assert h.metrics.fallback_reads.labels("fake", "NotFound")._value.get() == 1
    await h.backends.close()


async def test_every_store_identifies_the_pod_before_any_read(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"key": "v"}})
    with pytest.raises(Exception, match="this class needs pod tokens for the audiences: 'o'"):
        await h.mounter.mount(
            mount_input(
                [
                    {"store": "new", "objectName": "key", **{}},
                    {"store": "old", "objectName": "k2", "secretPath": "key"},
                ],
                tokens={"x": "y"},
            )
        )
    assert h.fake.reads == {}
    await h.backends.close()


async def test_the_audit_trail_knows_each_stores_source(tmp_path: Path) -> None:
    """Two stores holding the same ref: each object's source is its own store's."""
    h = Harness(tmp_path, cache_ttl=30)
    h.write({"secrets": {"a": "pw-1"}})
    objects = [
        {"store": "new", "objectName": "from-new", "secretPath": "a"},
        {"store": "old", "objectName": "from-old", "secretPath": "a"},
    ]
    first = await h.mounter.mount(mount_input(objects), audit=True)
    assert {s.name: s.source for s in first.served} == {"from-new": "store", "from-old": "store"}
    again = await h.mounter.mount(mount_input(objects), audit=True)
    assert {s.name: s.source for s in again.served} == {"from-new": "cache", "from-old": "cache"}
    await h.backends.close()
