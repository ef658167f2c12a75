"""What an operator meets first with `check` and `mount`: one line per problem on the right
stream, no traceback, no repeated or internal noise."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from provider.cli.main import main
from tests.cli.test_cli_check_mount import EXAMPLES, ROOT, cli, spc


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


def test_failed_in_process_mounts_under_load_are_one_line_each(tmp_path: Path) -> None:
    """Eight failing one-shot mounts at once (a loaded machine: the in-process provider stops
    while its client still holds the connection, which gRPC's C core logged as `Got goaway`):
    each says only its own last line, without the provider's JSON line for the same mount."""
    store = tmp_path / "empty.yaml"
    store.write_text("secrets: {}\n")
    argv = [sys.executable, "-m", "provider.cli.main", "mount", str(EXAMPLES / "fake-spc.yaml")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SECRETS_BRIDGE_", "GRPC_"))}
    runs = [
        subprocess.Popen(
            [*argv, "--target", str(tmp_path / f"v{i}"), "--enable-fake-backend",
             "--fake-store-file", str(store)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
        )
        for i in range(8)
    ]  # fmt: skip
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 1 and out == ""
        assert err.splitlines() == [
            "secrets-bridge mount: mount failed: NOT_FOUND: 4 objects failed: object "
            "'db.json': fake store: no secret at 'db-creds'; object 'db-password': fake store: "
            "no secret at 'db-creds'; object 'api-key': fake store: no secret at 'api-key'; "
            "object 'tls.crt': fake store: no secret at 'tls-cert-b64' (fake, pod "
            "default/secrets-bridge-mount (service account default))"
        ]


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
