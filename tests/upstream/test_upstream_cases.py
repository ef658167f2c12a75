"""The upstream providers' own parameter tests and e2e classes, run through our parser.

Each case in `cases/<dialect>.yaml` is one upstream test row (or one SecretProviderClass an
upstream e2e suite mounts), transcribed as data with its origin (repository, file, test, ref);
see README.md here for how each upstream provider decodes its parameters. A case is run the way
`secrets-bridge check` runs a class: `parse_plan(params, options_for=None, enable_test_stores=True)`
with `backend: <dialect>` added — the only key ever added.

Asserted: upstream's verdict (`verdict`), or, where the case records a deliberate difference
documented in docs/compatibility.md, `bridge_verdict` (with `bridge_reason`); and, where upstream
asserts them, the file names (`files`: each must be a planned file, or lie under a planned
object that expands into a directory, such as an Azure version history; with
`files_complete: true` no other file may be planned). `error_contains` and `versions` are
upstream's own message fragment and object version ids, kept for reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from provider.core.errors import InvalidParameters
from provider.mount.planning import MountPlan, parse_plan

CASES = Path(__file__).parent / "cases"
#: The dialects with upstream cases: one file each, named after the store.
DIALECTS = tuple(sorted(p.stem for p in CASES.glob("*.yaml")))
VERDICTS = ("valid", "invalid")


def _short(repo: str) -> str:
    return repo.split("/", 1)[1].removeprefix("secrets-store-csi-driver-")


def _load() -> list[Any]:
    params: list[Any] = []
    seen: dict[str, int] = {}
    for dialect in DIALECTS:
        for case in yaml.safe_load((CASES / f"{dialect}.yaml").read_text(encoding="utf-8")):
            origin = case["origin"]
            ident = f"{dialect}:{_short(origin['repo'])}:{origin['file']}:{origin['test']}"
            seen[ident] = seen.get(ident, 0) + 1
            if seen[ident] > 1:
                ident = f"{ident}#{seen[ident]}"
            params.append(pytest.param(dialect, case, id=ident))
    return params


ALL_CASES = _load()


def _planned_files(plan: MountPlan) -> list[str]:
    files = [spec.name for spec in plan.store.objects if spec.transforms.file]
    return files + [tmpl.path for tmpl in plan.templates]


def _covered(expected: str, planned: list[str]) -> bool:
    return expected in planned or any(expected.startswith(name + "/") for name in planned)


def _describe(case: dict[str, Any]) -> str:
    origin = case["origin"]
    where = f"{origin['repo']}@{origin['ref']} {origin['file']} {origin['test']}"
    extra = f"; upstream says: {case['error_contains']}" if case.get("error_contains") else ""
    why = f"; deliberate difference: {case['bridge_reason']}" if case.get("bridge_reason") else ""
    return f"{where}{extra}{why}"


def test_case_files_are_well_formed() -> None:
    """Every case names its origin, carries string parameters and a verdict; none sets backend."""
    for entry in ALL_CASES:
        dialect, case = entry.values
        assert set(case["origin"]) == {"repo", "file", "test", "ref"}, case["origin"]
        assert case["verdict"] in VERDICTS
        assert case.get("bridge_verdict", case["verdict"]) in VERDICTS
        assert ("bridge_verdict" in case) == ("bridge_reason" in case)
        assert "backend" not in case["parameters"], "only the test adds backend"
        assert all(isinstance(v, str) for v in case["parameters"].values()), case["origin"]
        assert dialect in DIALECTS


@pytest.mark.parametrize(("dialect", "case"), ALL_CASES)
def test_upstream_case(dialect: str, case: dict[str, Any]) -> None:
    params = {**case["parameters"], "backend": dialect}
    expected = case.get("bridge_verdict", case["verdict"])
    try:
        plan = parse_plan(params, options_for=None, enable_test_stores=True)
    except InvalidParameters as exc:
        if expected == "valid":
            pytest.fail(f"refused: {exc.problems}\n  upstream accepts it: {_describe(case)}")
        return
    if expected == "invalid":
        pytest.fail(
            f"accepted (warnings: {list(plan.warnings)})\n  upstream refuses it: {_describe(case)}"
        )
    planned = _planned_files(plan)
    missing = [f for f in case.get("files", []) if not _covered(f, planned)]
    assert not missing, f"files {missing} not planned (planned: {planned}): {_describe(case)}"
    if case.get("files_complete"):
        extra = [p for p in planned if not any(_covered(f, [p]) for f in case["files"])]
        assert not extra, f"files {extra} planned, upstream writes no such file: {_describe(case)}"
