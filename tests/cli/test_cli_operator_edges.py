"""What an operator meets first with `check` and `mount`: one line per problem on the right
stream, no traceback, no repeated or internal noise."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest

from provider.cli.main import main
from tests.cli.test_cli_check_mount import EXAMPLES, cli, spc


def test_check_names_the_file_once_per_problem(tmp_path: Path) -> None:
    path = spc(tmp_path, {"backend": "fake", "objects": "- objectName: ../x"})
    result = cli("check", path)
    assert result.returncode == 1
    lines = [line for line in result.stdout.splitlines() if "error" in line]
    assert lines, result.stdout
    assert all(line.count(path) == 1 for line in lines), lines


def test_check_yaml_error_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("kind: SecretProviderClass\nmetadata:\n  name: x\n spec: [\n")
    result = cli("check", str(path))
    assert result.returncode == 1
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"{path}: error: not valid YAML: line ")
    assert "column" in line and "Traceback" not in result.stderr


def test_mount_into_a_regular_file_is_one_line_on_stderr(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("not a directory")
    result = cli(
        "mount",
        str(EXAMPLES / "fake-spc.yaml"),
        "--target",
        str(target),
        "--enable-fake-backend",
        "--fake-store-file",
        str(EXAMPLES / "fake-store.yaml"),
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"secrets-bridge mount: --target {target} exists and is not a directory; name a directory"
    ]
    assert target.read_text() == "not a directory"


def test_one_shot_mount_prints_no_key_warning_or_grpc_noise(tmp_path: Path) -> None:
    result = cli(
        "mount",
        str(EXAMPLES / "fake-spc.yaml"),
        "--target",
        str(tmp_path / "v"),
        "--enable-fake-backend",
        "--fake-store-file",
        str(EXAMPLES / "fake-store.yaml"),
    )
    assert result.returncode == 0, result.stderr
    assert "hmac-key-file" not in result.stderr
    assert "goaway" not in result.stderr.lower(), result.stderr


def test_bench_plot_without_matplotlib_stops_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    started = time.monotonic()
    code = main(["bench", "--store", "fake", "--mounts", "10", "--plot", str(tmp_path / "p.png")])
    assert code == 1 and time.monotonic() - started < 5  # the install lacks it: not usage
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and "Traceback" not in err
