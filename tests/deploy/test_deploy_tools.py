"""deploy/tools.sh: once checkov is installed, running it again is a quick no-op."""

from __future__ import annotations

import subprocess
import time

from tests.deploy.conftest import DEPLOY, ROOT, tool

SCRIPT = DEPLOY / "tools.sh"


def test_tools_script_is_idempotent_and_quick_when_installed() -> None:
    tool(
        str(ROOT / ".tools" / "checkov" / "bin" / "checkov"),
        "checkov",
        "run `make tools` (deploy/tools.sh)",
    )
    start = time.monotonic()
    result = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - start < 5, "a second run must not reinstall"
    assert not result.stderr, "a second run should be silent"
