"""`make demo` runs the whole life of an inline volume on a real OpenBao; it must keep working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_walks_mount_rotation_and_removal() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devkit.demo"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    for n in range(1, 10):
        assert f"── {n}. " in out
    assert "db-password -> ..data/db-password  (mode 400)" in out
    assert "correct-horse-1" in out and "correct-horse-2" in out
    assert "(changed)" in out
    # Store calls, from OpenBao's own audit log: one login, one read per mount.
    final_counts = out.split("no second login):")[1].split("──")[0]
    assert "2 x read secret/data/db-password" in final_counts
    assert "1 x update auth/jwt/login" in final_counts
    assert "target exists: False" in out
    # The pod's token is never printed.
    assert "eyJ" not in out and "eyJ" not in result.stderr
