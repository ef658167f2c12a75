"""What ships and what `serve` loads: the wheel holds runtime code only, and building the
`serve` parser imports nothing of the bench, the driver emulation or the dev kit."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_PACKAGES = {"provider", "backends", "protos"}


def test_the_wheel_holds_only_runtime_code(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("secrets_bridge-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == RUNTIME_PACKAGES, top
    assert "provider/cli/main.py" in names and "backends/vault/store.py" in names
    assert "protos/provider.proto" in names
    dev = (
        "rigs.py", "demo.py", "echo.py", "openbao.py", "moto.py", "fakevault.py", "serving.py",
        "forward.py", "scale_model.py", "bench_all.sh",
    )  # fmt: skip
    assert not [n for n in names if "devkit" in n or n.startswith("tests/") or n.endswith(dev)]


def test_serve_imports_neither_bench_nor_devkit() -> None:
    probe = (
        "import sys\n"
        "from provider.cli.main import build_parser\n"
        "build_parser('serve').parse_args(['serve'])\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout.split()
    loaded = [
        m
        for m in out
        if m.startswith(("devkit", "provider.cli.bench", "provider.cli.mount", "tests"))
        or m in {"aiohttp.client", "cryptography", "protos.provider_pb2"}
    ]
    assert loaded == [], loaded
    assert "provider.cli.main" in out and "backends.vault.options" in out
