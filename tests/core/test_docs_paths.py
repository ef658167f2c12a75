"""The documents point at files that exist: every repository path named in a Markdown file
(module, test, doc) is there, so a re-layout cannot leave the docs describing an old tree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), *(ROOT / "tests" / "upstream").glob("*.md")]
)
PATH = re.compile(
    r"\b((?:provider|backends|devkit|tests|docs|deploy)/[\w./-]*\w\.(?:py|md|yaml|json|sh))"
)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_document_names_exists(doc: Path) -> None:
    named = set(PATH.findall(doc.read_text()))
    missing = sorted(p for p in named if "<" not in p and not (ROOT / p).exists())
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


SOURCES = sorted(
    p
    for top in ("provider", "backends", "devkit", "tests")
    for p in (ROOT / top).rglob("*.py")
    if "__pycache__" not in p.parts and not p.name.endswith("_pb2.py")
)


def test_every_path_a_docstring_or_comment_names_exists() -> None:
    """The same for the code: a module path named in a docstring or a comment exists (a
    re-layout once left the old single-module paths behind in them)."""
    missing = []
    for source in SOURCES:
        for path in set(PATH.findall(source.read_text())):
            if "<" not in path and not (ROOT / path).exists():
                missing.append(f"{source.relative_to(ROOT)}: {path}")
    assert not missing, missing
