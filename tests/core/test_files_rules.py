"""The driver's path rules (docs/architecture.md), applied before answering and by `check`."""

from __future__ import annotations

import pytest

from provider.core.files import overlap_problems, path_problem

GOOD = ["a", "a/b", "db.json", "dir/sub/file.txt", "a..b", ".hidden", "x" * 255]
BAD = [
    ("", "empty"),
    ("/abs", "absolute"),
    ("../x", "'..' element"),
    ("a/../b", "'..' element"),
    ("..data", "starts with '..'"),
    ("..x/y", "starts with '..'"),
    ("./a", "clean form"),
    ("a//b", "clean form"),
    ("a/", "clean form"),
    ("a/.", "clean form"),
    (".", "clean form"),
    ("x" * 256, "longer than 255"),
    ("/".join(["d" * 200] * 21), "longer than 4096"),
    ("a\0b", "NUL"),
    ("a\ud800b", "not valid UTF-8"),  # JSON's "\ud800" in an objectName: INTERNAL before
]


@pytest.mark.parametrize("path", GOOD)
def test_good_paths(path: str) -> None:
    assert path_problem(path) is None


@pytest.mark.parametrize(("path", "why"), BAD, ids=[repr(p[:12]) for p, _ in BAD])
def test_bad_paths(path: str, why: str) -> None:
    problem = path_problem(path)
    assert problem is not None and why in problem


def test_overlaps() -> None:
    assert overlap_problems(["a", "b/c"]) == []
    assert overlap_problems(["a", "a"]) == ["two files would be written to 'a'"]
    assert overlap_problems(["a", "a/b"]) == ["'a' is a file but 'a/b' needs it to be a directory"]


def test_a_part_too_long_names_the_path_start_and_end_in_one_line() -> None:
    # Issue 41 item 11: the message names what made the path (a selected secret's name).
    problem = path_problem("d/" + "n" * 300 + "-tail")
    assert problem is not None and "(305)" in problem
    assert "'d/nnn" in problem and "nnn-tail'" in problem and len(problem) < 250
    long_path = "/".join(["d" * 200] * 21)
    whole = path_problem(long_path)
    assert whole is not None and "'dddd" in whole and len(whole) < 250
