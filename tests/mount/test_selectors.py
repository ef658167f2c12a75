"""`select`: every secret under a prefix, through the mounter and the fake store, with the store's
calls counted (the listing as `list:<prefix>`, each secret read by its path)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devkit.testing import Harness, make_pod
from provider.core.errors import InvalidParameters, LimitExceeded, MountFailed, NotFound

PLAIN = {"objectName": "plain", "secretPath": "plain"}


def select(*entries: dict[str, object]) -> str:
    return yaml.safe_dump(list(entries))


async def test_a_selection_writes_a_file_per_secret_and_follows_the_store(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"app/a": "1", "app/sub/b": "2", "other/c": "3"}})
    chosen = select({"prefix": "app/", "directory": "app"})
    assert await h.files([], select=chosen) == {"app/a": b"1", "app/sub/b": b"2"}
    assert h.fake.reads == {"list:app/": 1, "app/a": 1, "app/sub/b": 1}
    # Unchanged: the next poll lists and reads every secret again (a listing proves permission
    # to list, never to read: nothing is reused on the strength of an unchanged marker).
    assert await h.files([], select=chosen) == {"app/a": b"1", "app/sub/b": b"2"}
    assert h.fake.reads == {"list:app/": 2, "app/a": 2, "app/sub/b": 2}
    # One added, one changed, one deleted: the deleted one is neither read nor mounted.
    h.write({"secrets": {"app/a": "1*", "app/new": "n", "other/c": "3"}})
    assert await h.files([], select=chosen) == {"app/a": b"1*", "app/new": b"n"}
    assert h.fake.reads == {"list:app/": 3, "app/a": 3, "app/sub/b": 2, "app/new": 1}


async def test_selected_secrets_take_extraction_and_templates(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"db/main": {"password": "p1"}, "db/replica": {"password": "p2"}}})
    chosen = select({"prefix": "db/", "directory": "db", "extract": "password"})
    templates = "- path: both\n  template: '${db/main},${db/replica}'\n"
    files = await h.files([], select=chosen, templates=templates)
    assert files == {"db/main": b"p1", "db/replica": b"p2", "both": b"p1,p2"}


async def test_a_selection_at_the_root_next_to_listed_objects(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"plain": "x", "cfg/a": "1"}})
    files = await h.files([PLAIN], select=select({"prefix": "cfg/"}))
    assert files == {"plain": b"x", "a": b"1"}
    h.write({"secrets": {"plain": "x", "cfg/plain": "clash"}})
    with pytest.raises(InvalidParameters, match="'plain'"):
        await h.files([PLAIN], select=select({"prefix": "cfg/"}))


async def test_an_empty_selection_is_no_error_unless_asked(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"plain": "x"}})
    assert await h.files([PLAIN], select=select({"prefix": "none/", "directory": "n"})) == {
        "plain": b"x"
    }
    strict = select({"prefix": "none/", "directory": "n", "optional": "false"})
    with pytest.raises(MountFailed, match=r"select\[0\]: no secret matches it") as info:
        await h.files([PLAIN], select=strict)
    assert isinstance(info.value.failures[0][1], NotFound)
    # Listed under its field, said once: not `object '': select[0]: ...` (a selector at the
    # volume's root has no directory to be named by).
    assert info.value.failures[0][0] == "select[0]"
    root = select({"prefix": "none/", "optional": "false"})
    with pytest.raises(MountFailed) as info:
        await h.files([PLAIN], select=root)
    assert str(info.value).startswith("select[0]: no secret matches it"), str(info.value)
    assert "object ''" not in str(info.value) and "object 'select[0]'" not in str(info.value)


async def test_a_selection_over_max_objects_is_refused_naming_the_count(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_objects=3)
    h.write({"secrets": {f"many/{i}": str(i) for i in range(5)}})
    with pytest.raises(MountFailed, match=r"matches 5 secrets, over .* limit of 3") as info:
        await h.files([], select=select({"prefix": "many/", "directory": "m"}))
    assert isinstance(info.value.failures[0][1], LimitExceeded)


async def test_hostile_names_are_refused_as_paths(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"x/../../etc/passwd": "no"}})
    with pytest.raises(MountFailed, match=r"'d/\.\./\.\./etc/passwd' contains a '\.\.' element"):
        await h.files([], select=select({"prefix": "x/", "directory": "d"}))
    h.write({"secrets": {"y/a": "1", "y/a/b": "2"}})
    with pytest.raises(InvalidParameters, match="d/a"):
        await h.files([], select=select({"prefix": "y/", "directory": "d"}))


async def test_a_denied_secret_fails_the_selection_and_nothing_is_shared(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"s/a": "1", "s/b": "2"}, "access": {"s/b": ["default/app"]}})
    chosen = select({"prefix": "s/", "directory": "s"})
    assert await h.files([], select=chosen) == {"s/a": b"1", "s/b": b"2"}
    other = make_pod(service_account="other")
    with pytest.raises(MountFailed, match="may not read 's/b'"):
        await h.mounter.mount(h.request([], pod=other, select=chosen))


async def test_selector_keys_are_checked(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    with pytest.raises(InvalidParameters, match=r"select\[0\]\.prefix") as info:
        await h.files([], select=select({"directory": "d"}))
    with pytest.raises(InvalidParameters, match=r"select\[0\]\.prefx is not a parameter") as info:
        await h.files([], select=select({"prefx": "a/", "prefix": "a/"}))
    with pytest.raises(InvalidParameters, match=r"select\[0\]\.store: only a class of several"):
        await h.files([], select=select({"prefix": "a/", "store": "x"}))
    with pytest.raises(InvalidParameters, match=r"select\[0\]\.directory"):
        await h.files([], select=select({"prefix": "a/", "directory": "../up"}))
    assert info.value.code.name == "INVALID_ARGUMENT"


async def test_a_class_of_only_a_root_selection(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"cfg/a": "1", "cfg/b": "2"}})
    assert await h.files([], select=select({"prefix": "cfg/"})) == {"a": b"1", "b": b"2"}


def test_check_shows_each_selector_as_parsed(tmp_path: Path) -> None:
    from provider.cli.check import _files

    h = Harness(tmp_path)
    plan = h.mounter.plan(
        h.request([PLAIN], select=select({"prefix": "app/", "directory": "d"})).params
    )
    (selector,) = [f for f in _files(plan) if f["object"] == "select[0]"]
    assert selector["selects"] == "app/*" and selector["directory"] is True


async def test_two_selectors_may_share_a_directory_and_a_collision_names_both(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"a/x": "1", "b/y": "2"}})
    both = select({"prefix": "a/", "directory": "d"}, {"prefix": "b/", "directory": "d"})
    assert await h.files([], select=both) == {"d/x": b"1", "d/y": b"2"}
    h.write({"secrets": {"a/x": "1", "b/x": "2"}})
    with pytest.raises(InvalidParameters, match=r"'d/x' \(by select\[0\] and select\[1\]\)"):
        await h.files([], select=both)


async def test_selectors_in_a_class_of_several_stores(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"plain": "x", "app/a": "1", "ops/b": "2"}})
    stores = "one: {backend: fake}\ntwo: {backend: fake, audience: ''}\n"
    params = {
        "stores": stores,
        "objects": yaml.safe_dump([{"store": "one", **PLAIN}]),
        "select": select(
            {"store": "one", "prefix": "app/", "directory": "app"},
            {"store": "two", "prefix": "ops/", "directory": "ops"},  # no objects of its own
        ),
    }
    request = h.request([])
    request = type(request)(params=params, pod=request.pod, permission=request.permission)
    result = await h.mounter.mount(request)
    assert {f.path: f.contents for f in result.files} == {
        "plain": b"x",
        "app/a": b"1",
        "ops/b": b"2",
    }
    bad = {**params, "select": select({"prefix": "app/"})}
    with pytest.raises(
        InvalidParameters, match=r"select\[0\]\.store: missing; .* names one of: one"
    ):
        h.mounter.plan(bad)


async def test_a_required_empty_selection_fails_from_the_cache_too(tmp_path: Path) -> None:
    h = Harness(tmp_path, cache_ttl=30)
    h.write({"secrets": {"plain": "x"}})
    strict = select({"prefix": "none/", "directory": "n", "optional": "false"})
    for _ in range(2):
        with pytest.raises(MountFailed, match=r"select\[0\]: no secret matches it"):
            await h.files([PLAIN], select=strict)


async def test_selectors_and_objects_share_max_objects(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_objects=4)
    h.write({"secrets": {"plain": "x", "a/1": "1", "a/2": "2", "b/1": "3", "b/2": "4"}})
    two = select({"prefix": "a/", "directory": "a"}, {"prefix": "b/", "directory": "b"})
    with pytest.raises(LimitExceeded, match=r"\(select\[0\] 2, select\[1\] 2\) are 5, over"):
        await h.files([PLAIN], select=two)
    assert len(await h.files([], select=two)) == 4


async def test_an_absolute_directory_is_refused_not_rewritten(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    with pytest.raises(InvalidParameters, match=r"select\[0\]\.directory \('/etc'\)"):
        await h.files([], select=select({"prefix": "a/", "directory": "/etc"}))
    h.write({"secrets": {"a/x": "1"}})
    assert await h.files([], select=select({"prefix": "a/", "directory": "d/"})) == {"d/x": b"1"}
