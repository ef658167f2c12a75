"""`check` on what an operator writes by mistake or by the docs (issue 41): a class of several
stores read only by selectors, a key given twice, an unquoted number, a refreshInterval the
provider will move."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from provider.cli import check as checking
from provider.cli.main import main

HEADER = """\
apiVersion: secrets-store.csi.x-k8s.io/v1
kind: SecretProviderClass
metadata: {name: c, namespace: default}
spec:
  provider: secrets-bridge
  parameters:
"""


def write(tmp_path: Path, parameters: dict[str, str] | str) -> str:
    path = tmp_path / "spc.yaml"
    if isinstance(parameters, str):
        path.write_text(HEADER + parameters)
    else:
        doc = yaml.safe_load(HEADER)
        doc["spec"]["parameters"] = parameters
        path.write_text(yaml.safe_dump(doc))
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def as_json(capsys: pytest.CaptureFixture[str], path: str) -> dict[str, Any]:
    code, out, _ = run(capsys, "--json", path)
    doc: dict[str, Any] = json.loads(out)
    assert code == (0 if doc["valid"] else 1)
    return doc


SELECTED_ONLY = {
    "stores": "a: {backend: fake}\nb: {backend: fake}\n",
    "objects": "- {store: a, objectName: db}\n",
    "select": "- {store: b, prefix: app/, directory: app}\n",
}


def test_a_store_read_only_by_selectors_is_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, write(tmp_path, SELECTED_ONLY))
    assert code == 0, out + err
    assert "store a (fake): objects: db;" in out
    assert "store b (fake): objects: none; selects: app/* into app;" in out
    doc = as_json(capsys, write(tmp_path, SELECTED_ONLY))
    (cls,) = doc["classes"]
    a, b = cls["stores"]
    assert [o["path"] for o in a["objects"]] == ["db"] and a["selects"] == []
    assert b["objects"] == []
    assert b["selects"] == [{"directory": "app", "object": "select[0]", "selects": "app/*"}]


def test_a_fallback_store_that_is_also_selected_is_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = {
        **SELECTED_ONLY,
        "objects": "- {store: a, objectName: db, fallback: {store: b, objectName: db}}\n",
    }
    doc = as_json(capsys, write(tmp_path, params))
    (cls,) = doc["classes"]
    assert cls["valid"], cls["errors"]
    a, b = cls["stores"]
    assert a["objects"] == [
        {
            "path": "db",
            "object": "objects[0].objectName",
            "fallback": "objects[0].fallback.objectName",
        }
    ]
    assert b["fallback_objects"] == [{"path": "db", "object": "objects[0].fallback.objectName"}]
    assert [s["directory"] for s in b["selects"]] == ["app"]


def test_real_stores_with_an_aws_selector_are_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = {
        "stores": "vault: {backend: vault, roleName: app, vaultAddress: 'https://vault:8200'}\n"
        "aws: {backend: aws, region: eu-west-1}\n",
        "objects": "- {store: vault, objectName: db, secretPath: secret/data/db, secretKey: pw}\n",
        "select": "- {store: aws, namePrefix: app/, directory: aws}\n",
    }
    code, out, err = run(capsys, write(tmp_path, params))
    assert code == 0, out + err
    assert "store aws (aws): objects: none; selects:" in out


def test_a_key_given_twice_in_the_class_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "    backend: vault\n    roleName: app\n    backend: aws\n")
    code, out, _ = run(capsys, path)
    assert code == 1
    assert out.splitlines() == [
        f"{path}: error: not valid YAML: line 9, column 5: the key 'backend' is given twice, "
        "on lines 7 and 9; keep one"
    ]


def test_a_key_given_twice_in_a_parameter_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = {"backend": "fake", "objects": "- objectName: a\n  objectName: b\n"}
    code, out, _ = run(capsys, write(tmp_path, params))
    assert code == 1
    assert (
        "error: objects: invalid YAML at line 2, column 3: the key 'objectName' is given "
        "twice, on lines 1 and 2; keep one"
    ) in out


@pytest.mark.parametrize("key", ["stores", "select", "templates"])
def test_a_key_given_twice_is_refused_in_every_yaml_parameter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    twice = {
        "stores": ("a: {backend: fake}\na: {backend: fake}\n", "'a'"),
        "select": ("- {prefix: app/, prefix: db/}\n", "'prefix'"),
        "templates": ("- {path: x, path: y, objects: [a]}\n", "'path'"),
    }
    text, named = twice[key]
    params = {"backend": "fake", "objects": "- objectName: a\n", key: text}
    if key == "stores":
        params = {"stores": text, "objects": "- {store: a, objectName: a}\n"}
    code, out, _ = run(capsys, write(tmp_path, params))
    assert code == 1
    assert f"{key}: invalid YAML at line " in out and f"the key {named} is given twice" in out


def test_an_unquoted_number_says_parameters_are_strings_and_how_to_quote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path, "    backend: fake\n    refreshInterval: 90\n    objects: '- objectName: a'\n"
    )
    code, out, _ = run(capsys, path)
    assert code == 1
    (line,) = out.splitlines()
    assert line == (
        f"{path}: error: SecretProviderClass c: class parameters are strings (the API server "
        "refuses anything else): refreshInterval is a number, not a string: quote it, "
        'refreshInterval: "90"'
    )


def test_a_map_where_a_string_belongs_says_to_write_a_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "    backend: fake\n    objects:\n      - objectName: a\n")
    code, out, _ = run(capsys, path)
    assert code == 1
    assert "objects is a YAML list: write it as a block, 'objects: |' with the YAML below it" in out


@pytest.mark.parametrize(
    ("interval", "applied", "warning"),
    [
        ("5s", 30.0, "refreshInterval 5s is under this provider's floor of 30s"),
        ("2h", 3600.0, "refreshInterval 2h is over this provider's ceiling of 3600s"),
        ("90s", 90.0, None),
    ],
)
def test_refresh_interval_shows_the_bound_that_applies_with_default_flags(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    interval: str,
    applied: float,
    warning: str | None,
) -> None:
    path = write(
        tmp_path, {"backend": "fake", "objects": "- objectName: a", "refreshInterval": interval}
    )
    doc = as_json(capsys, path)
    (cls,) = doc["classes"]
    assert cls["refresh_interval_s"] == applied
    moved = [w for w in cls["warnings"] if "refreshInterval" in w]
    assert moved == (
        [
            f"{warning} (--{'min' if applied == 30 else 'max'}-refresh-interval): "
            f"{applied:g}s is used"
        ]
        if warning
        else []
    )


def test_refresh_interval_bounds_given_to_check_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path, {"backend": "fake", "objects": "- objectName: a", "refreshInterval": "5s"}
    )
    limits = checking.Limits(min_refresh_interval=1.0)
    assert checking.run([path], as_json=True, limits=limits) == 0
    (cls,) = json.loads(capsys.readouterr().out)["classes"]
    assert cls["refresh_interval_s"] == 5.0
    assert not [w for w in cls["warnings"] if "refreshInterval" in w]


def test_a_key_given_twice_in_an_azure_array_entry_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = {
        "backend": "azure",
        "keyvaultName": "kv",
        "tenantId": "t",
        "clientID": "c",
        "objects": "array:\n  - |\n    objectName: a\n    objectType: secret\n    objectName: b\n",
    }
    code, out, _ = run(capsys, write(tmp_path, params))
    assert code == 1
    assert (
        "error: objects.array[0]: invalid YAML at line 3, column 1: the key 'objectName' is "
        "given twice, on lines 1 and 3; keep one"
    ) in out
