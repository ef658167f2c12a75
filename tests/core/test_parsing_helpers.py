"""Shared parsing helpers: modes, booleans, safe YAML (no aliases, bounded depth)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from provider.core.boundedyaml import load_yaml
from provider.core.errors import InvalidParameters
from provider.core.model import ObjectSpec, ParseContext
from provider.core.parsing import ObjectList, Problems, parse_bool, parse_mode, parse_objects


@pytest.mark.parametrize(
    ("value", "mode"), [(0o400, 0o400), ("0400", 0o400), ("644", 0o644), (None, None), ("", None)]
)
def test_modes(value: object, mode: int | None) -> None:
    problems = Problems()
    assert parse_mode(value, "f", problems) == mode
    assert problems.items == []


@pytest.mark.parametrize("value", ["0999", "rw", True, 0o1777, -1, "0x1"])
def test_bad_modes(value: object) -> None:
    problems = Problems()
    assert parse_mode(value, "objects[0].filePermission", problems) is None
    assert problems.items[0].startswith("objects[0].filePermission")


@pytest.mark.parametrize("value", ["yes", "1", 3])
def test_bad_bool(value: object) -> None:
    problems = Problems()
    parse_bool(value, "explode", problems)
    assert "explode" in problems.items[0]


def test_yaml_aliases_are_refused_quickly() -> None:
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    start = time.monotonic()
    with pytest.raises(InvalidParameters, match=r"objects: invalid YAML at line 2.*aliases"):
        load_yaml(laughs, "objects")
    assert time.monotonic() - start < 1.0


def test_deep_yaml_is_refused() -> None:
    with pytest.raises(InvalidParameters, match="nested deeper than"):
        load_yaml("[" * 100 + "]" * 100, "objects")


def test_oversized_yaml_is_refused() -> None:
    with pytest.raises(InvalidParameters, match="over the"):
        load_yaml("- a\n" * 200_000, "objects")


def test_yaml_error_names_field_and_line() -> None:
    with pytest.raises(InvalidParameters, match=r"^templates: invalid YAML at line 2"):
        load_yaml("- a: 1\n - b: [", "templates")


FORM = ObjectList("a test object", frozenset({"objectName"}), empty="objects: none listed")


def entry(obj: Mapping[str, Any], where: str) -> ObjectSpec[str]:
    return ObjectSpec(str(obj.get("objectName")), "ref", field=f"{where}.objectName")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("", "objects is required: a YAML list of {objectName}"),
        ("[]", "objects: none listed"),
        ("a: 1", "objects: expected a YAML list, got dict"),
        ("- 1", "objects[0]: expected a map of keys to values, got int"),
        ("- {objectName: a}\n- {objectName: a}", "objectName 'a' is used by objects[0]"),
        ("- {objectName: a}\n- {objectName: b}\n- {objectName: c}", "3 entries is over the limit"),
    ],
)
def test_an_object_list_names_each_problem(raw: str, problem: str) -> None:
    problems = Problems()
    parse_objects(raw, FORM, entry, ParseContext(max_objects=2), problems)
    assert problem in problems.items[0], problems.items


def test_an_object_lists_entries_keep_the_extension_keys_and_warn_of_others() -> None:
    problems = Problems()
    raw = "- {objectName: a, optional: true, colour: red}"
    specs = parse_objects(raw, FORM, entry, ParseContext(), problems)
    assert [s.name for s in specs] == ["a"] and problems.items == []
    assert problems.warnings == [
        "objects[0].colour is not a parameter of a test object (objectName 'a') and is "
        "ignored, as upstream ignores it; the nearest known key is 'decode'"
    ]
