"""The committed stubs are exactly what `make protos` generates from protos/provider.proto."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ["provider_pb2.py", "provider_pb2_grpc.py", "provider_pb2.pyi"]


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    (tmp_path / "protos").mkdir()
    shutil.copy(ROOT / "protos" / "provider.proto", tmp_path / "protos")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            "--python_out=.",
            "--grpc_python_out=.",
            "--pyi_out=.",
            "protos/provider.proto",
        ],
        cwd=tmp_path,
        check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "protos" / name).read_text()
        assert fresh == (ROOT / "protos" / name).read_text(), f"protos/{name} is stale: make protos"


def test_wire_names_and_numbers_match_the_driver() -> None:
    from protos import provider_pb2

    d = provider_pb2.DESCRIPTOR
    assert d.package == "v1alpha1"
    service = d.services_by_name["CSIDriverProvider"]
    assert [m.full_name for m in service.methods] == [
        "v1alpha1.CSIDriverProvider.Version",
        "v1alpha1.CSIDriverProvider.Mount",
    ]
    fields = {
        name: {f.name: f.number for f in msg.fields}
        for name, msg in d.message_types_by_name.items()
    }
    assert fields == {
        "VersionRequest": {"version": 1},
        "VersionResponse": {"version": 1, "runtime_name": 2, "runtime_version": 3},
        "MountRequest": {
            "attributes": 1,
            "secrets": 2,
            "target_path": 3,
            "permission": 4,
            "current_object_version": 5,
        },
        "MountResponse": {"object_version": 1, "error": 2, "files": 3},
        "File": {"path": 1, "mode": 2, "contents": 3},
        "ObjectVersion": {"id": 1, "version": 2},
        "Error": {"code": 1},
    }
