"""`check` and `mount` as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = Path(__file__).parent / "data"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provider.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def spc(tmp_path: Path, parameters: dict[str, str], provider: str = "secrets-bridge") -> str:
    doc = {
        "apiVersion": "secrets-store.csi.x-k8s.io/v1",
        "kind": "SecretProviderClass",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"provider": provider, "parameters": parameters},
    }
    path = tmp_path / "spc.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_check_accepts_the_example() -> None:
    result = cli("check", str(EXAMPLES / "fake-spc.yaml"))
    assert result.returncode == 0, result.stdout
    assert "valid" in result.stdout


@pytest.mark.parametrize(
    ("parameters", "provider", "messages"),
    [
        ({"objects": "- objectName: a"}, "secrets-bridge", ["parameter 'backend' is missing"]),
        (
            {
                "backend": "fake",
                "objects": "- objectName: a\n- objectName: b\n  extrakt: x\n  decode: z",
            },
            "azure",
            ["spec.provider is 'azure'", "objects[1].extrakt", "objects[1].decode"],
        ),
        (
            {"backend": "fake", "objects": "- objectName: ../a\n- objectName: a//b"},
            "secrets-bridge",
            ["'..' element", "clean form"],
        ),
        (
            {
                "backend": "fake",
                "objects": "- objectName: a",
                "templates": "- path: t\n  template: ${b}",
            },
            "secrets-bridge",
            ["unknown object 'b'"],
        ),
    ],
)
def test_check_prints_every_problem(
    tmp_path: Path, parameters: dict[str, str], provider: str, messages: list[str]
) -> None:
    result = cli("check", spc(tmp_path, parameters, provider))
    assert result.returncode == 1
    for message in messages:
        assert message in result.stdout


def test_check_warns_about_unknown_keys(tmp_path: Path) -> None:
    result = cli(
        "check", spc(tmp_path, {"backend": "fake", "objects": "- objectName: a", "objcets": "typo"})
    )
    assert result.returncode == 0
    assert "'objcets' is not used by the fake backend" in result.stdout


def test_check_refuses_non_string_parameters(tmp_path: Path) -> None:
    path = tmp_path / "spc.yaml"
    path.write_text(
        "kind: SecretProviderClass\nmetadata: {name: x}\n"
        "spec: {provider: secrets-bridge, parameters: {backend: fake, objects: [1]}}\n"
    )
    result = cli("check", str(path))
    assert result.returncode == 1 and "class parameters are strings" in result.stdout


def test_check_on_missing_file(tmp_path: Path) -> None:
    result = cli("check", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1 and "cannot read the file" in result.stdout


def test_mount_writes_the_driver_layout(tmp_path: Path) -> None:
    target = tmp_path / "vol"
    result = cli(
        "mount",
        str(EXAMPLES / "fake-spc.yaml"),
        "--target",
        str(target),
        "--enable-fake-backend",
        "--fake-store-file",
        str(EXAMPLES / "fake-store.yaml"),
        "--log-format",
        "text",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert os.path.islink(target / "..data")
    assert os.readlink(target / "db-password") == "../data/db-password".replace("../", "..")
    assert (target / "db-password").read_text() == "s3cr3t-demo"
    assert (target / "pgpass").stat().st_mode & 0o777 == 0o400
    # Secret values are printed only on request.
    assert "s3cr3t-demo" not in result.stdout + result.stderr


def test_mount_with_csidriver_rules(tmp_path: Path) -> None:
    csidriver = tmp_path / "csidriver.yaml"
    csidriver.write_text(
        yaml.safe_dump(
            {
                "kind": "CSIDriver",
                "spec": {"podInfoOnMount": True, "volumeLifecycleModes": ["Persistent"]},
            }
        )
    )
    args = [
        "mount",
        str(EXAMPLES / "fake-spc.yaml"),
        "--target",
        str(tmp_path / "v"),
        "--enable-fake-backend",
        "--fake-store-file",
        str(EXAMPLES / "fake-store.yaml"),
    ]
    refused = cli(*args, "--csidriver", str(csidriver))
    assert refused.returncode == 1 and "Ephemeral" in refused.stderr

    csidriver.write_text(
        yaml.safe_dump(
            {
                "kind": "CSIDriver",
                "spec": {
                    "podInfoOnMount": True,
                    "volumeLifecycleModes": ["Ephemeral"],
                    "tokenRequests": [{"audience": "vault"}],
                },
            }
        )
    )
    token = tmp_path / "tok"
    token.write_text("jwt")
    spc_path = spc(
        tmp_path, {"backend": "fake", "audience": "fake-aud", "objects": "- objectName: api-key"}
    )
    args[1] = spc_path
    dropped = cli(*args, "--csidriver", str(csidriver), "--token", f"fake-aud={token}")
    assert dropped.returncode == 1
    assert "no token for audience 'fake-aud'" in dropped.stderr
    assert "FAILED_PRECONDITION" in dropped.stderr and "tokenRequests" in dropped.stderr
    assert dropped.stdout == ""
