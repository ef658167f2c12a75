"""`check` as the migration tool: several files and stdin, `--json`, serve's limits, exit codes,
and every class the upstream providers' e2e suites mount, with only provider and backend
changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.test_cli_check_mount import EXAMPLES, ROOT, cli

CASES = ROOT / "tests" / "upstream" / "cases"


def manifest(name: str, parameters: dict[str, str], provider: str = "secrets-bridge") -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "secrets-store.csi.x-k8s.io/v1",
            "kind": "SecretProviderClass",
            "metadata": {"name": name, "namespace": "apps"},
            "spec": {"provider": provider, "parameters": parameters},
        }
    )


def check_stdin(text: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provider.cli.main", "check", *args],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


VAULT = {
    "backend": "vault",
    "roleName": "app",
    "vaultAddress": "https://vault:8200",
    "objects": "- {objectName: db, secretPath: secret/data/db, secretKey: pw, filePermission: 0400}"
    "\n- {objectName: cfg, secretPath: secret/data/cfg, explode: true}",
    "templates": "- {path: app.env, format: env, objects: [db]}",
}
PLAIN = {k: v for k, v in VAULT.items() if k != "templates"}


def test_json_lists_files_store_and_audiences(tmp_path: Path) -> None:
    path = tmp_path / "vault.yaml"
    path.write_text(manifest("db", VAULT))
    result = cli("check", "--json", str(path))
    assert result.returncode == 0, result.stdout
    doc = json.loads(result.stdout)
    assert doc["valid"] is True
    assert doc["limits"] == {
        "max_objects": 100,
        "max_response_bytes": 4 * 1024 * 1024,
        "strict_parameters": False,
        "min_refresh_interval": 30.0,
        "max_refresh_interval": 3600.0,
    }
    (cls,) = doc["classes"]
    assert (cls["source"], cls["name"], cls["namespace"]) == (str(path), "db", "apps")
    assert cls["backend"] == "vault" and cls["audiences"] == ["vault"]
    assert cls["store"]["address"] == "https://vault:8200" and cls["store"]["role"] == "app"
    assert cls["files"] == [
        {
            "path": "db",
            "mode": "0400",
            "object": "objects[0].objectName",
            "version_id": "db",
            "directory": False,
            "lifetime": None,
        },
        {
            "path": "cfg",
            "mode": None,
            "object": "objects[1].objectName",
            "version_id": "cfg",
            "directory": True,
            "lifetime": None,
        },
        {
            "path": "app.env",
            "mode": None,
            "object": "templates[0]",
            "version_id": "app.env",
            "directory": False,
            "lifetime": None,
        },
    ]
    assert cls["errors"] == [] and cls["warnings"] == []


def test_json_says_which_objects_are_credentials_with_a_lifetime_and_why(tmp_path: Path) -> None:
    objects = (
        "- {objectName: db, secretPath: database/creds/app}\n"
        "- {objectName: tls.crt, secretPath: pki/issue/web, method: POST, secretKey: certificate}"
        "\n- {objectName: token, secretPath: auth/token/create, method: POST}\n"
        "- {objectName: kv, secretPath: secret/data/app}"
    )
    path = tmp_path / "dynamic.yaml"
    path.write_text(manifest("dynamic", {**PLAIN, "objects": objects, "renewAt": "1/2"}))
    result = cli("check", "--json", str(path))
    assert result.returncode == 0, result.stdout
    (cls,) = json.loads(result.stdout)["classes"]
    lifetimes = {f["path"]: f["lifetime"] for f in cls["files"]}
    assert lifetimes == {
        "db": {
            "kind": "lease",
            "why": "database/creds/app is a secrets engine's credentials path (leased)",
        },
        "tls.crt": {
            "kind": "certificate",
            "why": "POST pki/issue/web issues a certificate (notAfter)",
        },
        "token": {"kind": "lease", "why": "POST auth/token/create is a dynamic secret's request"},
        "kv": None,
    }
    assert cls["warnings"] == []  # renewAt is a parameter of every class


@pytest.mark.parametrize("renew_at", ["0", "1", "1.5", "soon", "1/0"])
def test_a_renew_at_outside_zero_to_one_is_refused_naming_the_field(
    tmp_path: Path, renew_at: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(manifest("bad", {**PLAIN, "renewAt": renew_at}))
    result = cli("check", "--json", str(path))
    assert result.returncode != 0
    (cls,) = json.loads(result.stdout)["classes"]
    assert cls["errors"] == [
        "renewAt: expected a fraction of a credential's life above 0 and below 1, such as 0.5 "
        f"or 1/2, got {renew_at!r}"
    ]


@pytest.mark.parametrize(
    ("parameters", "audiences"),
    [
        (
            {
                "backend": "aws",
                "region": "us-east-1",
                "objects": "- {objectName: a, objectType: secretsmanager}",
            },
            ["sts.amazonaws.com"],
        ),
        (
            {
                "backend": "aws",
                "region": "us-east-1",
                "usePodIdentity": "true",
                "objects": "- {objectName: a, objectType: secretsmanager}",
            },
            ["pods.eks.amazonaws.com"],
        ),
        (
            {
                "backend": "gcp",
                "secrets": "- {resourceName: projects/p/secrets/s/versions/1, path: a}",
            },
            ["<PROJECT>.svc.id.goog"],
        ),
        (
            {
                "backend": "gcp",
                "auth": "provider-adc",
                "secrets": "- {resourceName: projects/p/secrets/s/versions/1, path: a}",
            },
            [],
        ),
        (
            {
                "backend": "azure",
                "keyvaultName": "kv1",
                "tenantID": "t",
                "clientID": "c",
                "objects": "array:\n  - |\n    objectName: s\n    objectType: secret\n",
            },
            ["api://AzureADTokenExchange"],
        ),
        (
            {
                "backend": "azure",
                "keyvaultName": "kv1",
                "tenantID": "t",
                "objects": "array:\n  - |\n    objectName: s\n    objectType: secret\n",
            },
            [],
        ),
    ],
)
def test_json_names_the_audiences_each_store_needs(
    parameters: dict[str, str], audiences: list[str]
) -> None:
    result = check_stdin(manifest("c", parameters), "--json", "-")
    doc = json.loads(result.stdout)
    assert doc["classes"][0]["audiences"] == audiences, doc


def test_several_files_and_stdin_in_one_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(manifest("broken", {"backend": "vault", "objects": "- {objectName: a}"}))
    listed = yaml.safe_dump(
        {"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(manifest("db", VAULT))]}
    )
    result = check_stdin(listed, str(EXAMPLES / "fake-spc.yaml"), "-", str(bad))
    assert result.returncode == 1, result.stdout
    lines = result.stdout.splitlines()
    assert any(
        line.startswith(f"{EXAMPLES / 'fake-spc.yaml'}: SecretProviderClass demo-app: valid")
        for line in lines
    )
    assert any(line.startswith("<stdin>: SecretProviderClass db: valid") for line in lines)
    assert any(
        line.startswith(f"{bad}: SecretProviderClass broken: error: roleName is required")
        for line in lines
    )
    as_json = check_stdin(listed, "--json", str(bad), "-")
    doc = json.loads(as_json.stdout)
    assert [(c["source"], c["name"], c["valid"]) for c in doc["classes"]] == [
        (str(bad), "broken", False),
        ("<stdin>", "db", True),
    ]
    assert doc["valid"] is False and as_json.returncode == 1


def test_unreadable_file_is_reported_as_invalid(tmp_path: Path) -> None:
    result = cli("check", "--json", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    (cls,) = json.loads(result.stdout)["classes"]
    assert cls["name"] is None and "cannot read the file" in cls["errors"][0]


@pytest.mark.parametrize(
    "args",
    [
        ["check"],  # no file
        ["check", "--max-objects", "many", "x.yaml"],
        ["check", "--max-objects", "0", "x.yaml"],
        ["check", "--bogus", "x.yaml"],
        ["check", "-", "-"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    assert cli(*args).returncode == 2


def test_limits_and_strict_parameters_as_serve_applies_them(tmp_path: Path) -> None:
    objects = "\n".join(f"- objectName: o{i}\n  secretPath: s/{i}" for i in range(3))
    path = tmp_path / "c.yaml"
    path.write_text(manifest("c", {**PLAIN, "objects": objects + "\n  colour: red"}))
    plain = cli("check", str(path))
    assert plain.returncode == 0, plain.stdout
    assert (
        "objects[2].colour is not a parameter of a vault object (objectName 'o2') and is "
        "ignored" in plain.stdout
    )
    limited = cli("check", "--max-objects", "2", str(path))
    assert limited.returncode == 1 and "--max-objects" in limited.stdout
    strict = cli("check", "--strict-parameters", str(path))
    assert strict.returncode == 1
    assert "error: objects[2].colour is not a parameter" in strict.stdout
    assert "--strict-parameters" in strict.stdout


def test_limits_come_from_the_same_environment_as_serve(tmp_path: Path) -> None:
    objects = "\n".join(f"- {{objectName: o{i}, secretPath: s/{i}}}" for i in range(3))
    path = tmp_path / "c.yaml"
    path.write_text(manifest("c", {**PLAIN, "objects": objects}))
    result = subprocess.run(
        [sys.executable, "-m", "provider.cli.main", "check", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"SECRETS_BRIDGE_MAX_OBJECTS": "2", "PATH": "/usr/bin:/bin"},
    )
    doc = json.loads(result.stdout)
    assert doc["limits"]["max_objects"] == 2 and result.returncode == 1


# -- every class the upstream e2e suites mount ---------------------------------------------------


def _e2e_cases() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(CASES.glob("*.yaml")):
        dialect = path.stem
        for case in yaml.safe_load(path.read_text(encoding="utf-8")):
            where = case["origin"]["file"]
            if not where.endswith("_test.go") or where.startswith("test/e2e/"):
                found.append((dialect, case))
    return found


def test_every_upstream_e2e_class_passes_check_with_provider_and_backend_changed() -> None:
    cases = _e2e_cases()
    assert len(cases) >= 60
    stream = "---\n".join(
        manifest(f"c{i}", {**case["parameters"], "backend": dialect})
        for i, (dialect, case) in enumerate(cases)
    )
    result = check_stdin(stream, "--json", "-")
    doc = json.loads(result.stdout)
    assert len(doc["classes"]) == len(cases)
    for (dialect, case), cls in zip(cases, doc["classes"], strict=True):
        expected = case.get("bridge_verdict", case["verdict"]) == "valid"
        origin = f"{dialect} {case['origin']['file']} {case['origin']['test']}"
        assert cls["valid"] is expected, (origin, cls["errors"])
        if expected and case.get("files"):
            planned = [f["path"] for f in cls["files"]]
            assert all(
                name in planned or any(name.startswith(p + "/") for p in planned)
                for name in case["files"]
            ), (origin, planned)
