"""`select` on Key Vault as a class is parsed: its keys, its bounds, its ref; and the listing's
change markers."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from backends.azure import listing
from backends.azure.selectors import AzureSelection
from provider.core.errors import InvalidParameters
from provider.mount.planning import parse_plan
from tests.backends.azure.conftest import CLIENT, TENANT


def plan(*selectors: Any, **extra: str) -> Any:
    params = {"backend": "azure", "keyvaultName": "kv1", "tenantID": TENANT, "clientID": CLIENT}
    params["select"] = yaml.safe_dump(list(selectors))
    return parse_plan(
        {**params, **extra}, options_for=None, enable_test_stores=False, max_objects=40
    )


def test_a_class_with_select_and_no_objects_parses_to_a_selection_ref() -> None:
    [spec] = plan(
        {"namePrefix": "app-", "tags": {"team": "pay", "tier": 1}, "directory": "a"}
    ).objects
    assert spec.name == "a" and spec.transforms.optional
    assert spec.ref == AzureSelection("app-", (("team", "pay"), ("tier", "1")), 40)
    assert hash(spec.ref) == hash(AzureSelection("app-", (("team", "pay"), ("tier", "1")), 40))
    assert spec.ref.describe() == "the selector app-* tagged team=pay, tier=1"
    [tags_only] = plan({"tags": {"env": "prod"}, "directory": "a"}).objects
    assert tags_only.ref.prefix == "" and tags_only.ref.describe().endswith("tagged env=prod")


def test_a_class_with_neither_objects_nor_select_is_refused() -> None:
    params = {"backend": "azure", "keyvaultName": "kv1", "tenantID": TENANT, "clientID": CLIENT}
    with pytest.raises(InvalidParameters, match=r"objects is required.*or `select`"):
        parse_plan(params, options_for=None, enable_test_stores=False)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"directory": "d"}, r"select\[0\]: a Key Vault selector needs namePrefix, tags or both"),
        ({"namePrefix": "app/"}, r"select\[0\]\.namePrefix 'app/': Key Vault names are"),
        ({"namePrefix": "x" * 128}, r"namePrefix 'x{100}"),
        ({"tags": ["team"]}, r"select\[0\]\.tags: expected a map"),
        ({"tags": {f"t{i}": "v" for i in range(51)}}, r"51 tags, over the limit of 50"),
        ({"tags": {"t": "v" * 257}}, r"select\[0\]\.tags\.t: a tag value is at most 256"),
        ({"tags": {"": "v"}}, r"a tag name must be 1-512 characters"),
        ({"tags": {"t": {"nested": 1}}}, r"select\[0\]\.tags\.t: expected a string"),
        ({"prefix": "app-"}, r"select\[0\]\.prefix is not a parameter"),
        ({"path": "app"}, r"select\[0\]\.path is not a parameter"),
        ({"namePrefix": "a-", "directory": "../up"}, r"select\[0\]\.directory"),
        ({"namePrefix": "a-", "optional": "maybe"}, r"select\[0\]\.optional"),
    ],
)
def test_bad_selectors_are_refused_one_line_each(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidParameters, match=message) as info:
        plan(entry)
    assert info.value.code.name == "INVALID_ARGUMENT"


def test_every_problem_of_every_selector_at_once() -> None:
    with pytest.raises(InvalidParameters) as info:
        plan({"namePrefix": "a/b"}, {"tags": "x"}, {"directory": "d"})
    text = str(info.value)
    assert "select[0].namePrefix" in text and "select[1].tags" in text and "select[2]:" in text


def props(updated: float | None, version: str | None = None) -> Any:
    when = datetime.fromtimestamp(updated, UTC) if updated is not None else None
    return SimpleNamespace(updated_on=when, created_on=when, version=version)


def test_the_change_marker_is_the_version_and_updated_time_unless_just_changed() -> None:
    now = 1_800_000_000.0
    settled = props(now - 3600)
    assert listing._marker(settled, now) == listing._marker(settled, now + 60)
    assert listing._marker(settled, now) != listing._marker(props(now - 3599), now)
    assert listing._marker(props(now - 3600, "v2"), now) != listing._marker(settled, now)
    # Key Vault's times are whole seconds: a secret changed moments ago may change again within
    # its second unseen, so its marker is never the same twice (read again at the next poll).
    fresh = props(now - 5)
    assert listing._marker(fresh, now) != listing._marker(fresh, now)
    assert listing._marker(props(None), now) != listing._marker(props(None), now)
