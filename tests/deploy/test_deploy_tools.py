"""deploy/tools.sh: checkov comes from deploy/checkov.lock (made by deploy/lock.sh, every file
hashed), installed with --require-hashes, a line per step with its elapsed time; once it is
installed, running the script again is a quick, silent no-op."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.conftest import DEPLOY, ROOT, tool

SCRIPT = DEPLOY / "tools.sh"
LOCK = DEPLOY / "checkov.lock"
VENV = ROOT / ".tools" / "checkov"
STEP = re.compile(r"^deploy/tools\.sh: \[\d+s\] ")


def locked(lock: Path) -> list[Requirement]:
    """Every requirement of a lock (one name may appear once per marker); each must be pinned
    with ==, and carry sha256 hashes."""
    found = []
    for entry in re.split(r"\n(?=\S)", lock.read_text().replace("\\\n", " ")):
        if not entry.strip() or entry.lstrip().startswith("#"):
            continue
        requirement, *hashes = entry.split("#", 1)[0].split(" --hash=")
        assert hashes and all(h.startswith("sha256:") for h in hashes), f"no hashes: {entry}"
        req = Requirement(requirement.strip())
        assert [s.operator for s in req.specifier] == ["=="], f"not pinned: {entry}"
        found.append(req)
    return found


def applicable(lock: Path) -> dict[str, str]:
    """name -> version of the lock's requirements whose marker holds on this machine."""
    env = default_environment()
    return {
        canonicalize_name(r.name): next(iter(r.specifier)).version
        for r in locked(lock)
        if r.marker is None or r.marker.evaluate(env)
    }


def script_setting(script: Path, name: str) -> str:
    match = re.search(rf'^{name}="([^"]+)"$', script.read_text(), flags=re.M)
    assert match, f"no {name} in {script.name}"
    return match.group(1)


def test_checkov_is_locked_by_the_lock_script_with_every_file_hashed() -> None:
    assert "#    deploy/lock.sh" in LOCK.read_text().splitlines()[1]
    pins = applicable(LOCK)
    lock_script = DEPLOY / "lock.sh"
    assert pins["checkov"] == script_setting(lock_script, "CHECKOV_VERSION")
    assert pins["pip"] == script_setting(lock_script, "PIP_VERSION")
    assert len(pins) > 50, "checkov's dependencies are locked too"


def test_the_installed_checkov_is_the_locked_one() -> None:
    python = tool(str(VENV / "bin" / "python"), "checkov's venv", "run `make tools`")
    listing = subprocess.run(
        [python, "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    installed = {canonicalize_name(p["name"]): p["version"] for p in json.loads(listing.stdout)}
    want = applicable(LOCK)
    drifted = sorted(
        f"{name}: installed {installed.get(name, 'nothing')}, locked {version}"
        for name, version in want.items()
        if installed.get(name) != version
    )
    # Python 3.11's venv seeds setuptools beside pip; nothing imports it.
    extra = sorted(set(installed) - set(want) - {"setuptools"})
    assert not drifted, "run `make tools` (deploy/tools.sh):\n" + "\n".join(drifted)
    assert not extra, f"installed but not in deploy/checkov.lock: {extra}"


def test_a_file_that_does_not_match_its_hash_stops_the_install(tmp_path: Path) -> None:
    """Hashes are enforced, and a failing step says which, after a line per step."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    shutil.copy(SCRIPT, deploy / "tools.sh")
    # The venv's own pip may already be the locked one (then pip is not fetched): spoil every
    # hash of the first package the lock fetches after it.
    text = LOCK.read_text()
    first = re.search(r"(?m)^(?!pip==)[a-z0-9-]+==\S+ \\\n(?:\s+--hash=sha256:\w+ ?\\?\n)+", text)
    assert first
    spoiled = re.sub(r"sha256:\w{64}", "sha256:" + "0" * 64, first.group(0))
    tampered = text.replace(first.group(0), spoiled)
    assert tampered != text
    (deploy / "checkov.lock").write_text(tampered)
    result = subprocess.run(
        ["bash", str(deploy / "tools.sh")], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 1, result.stderr
    assert "DO NOT MATCH THE HASHES" in result.stderr
    steps = [line for line in result.stderr.splitlines() if STEP.match(line)]
    assert "installing checkov" in steps[0]
    assert steps[-1].endswith(
        "pip install -r deploy/checkov.lock failed "
        f"(the log above is {tmp_path}/.tools/checkov-install.log)"
    )
    assert not (tmp_path / ".tools" / "checkov" / "bin" / "checkov").exists()


def test_tools_script_is_idempotent_and_quick_when_installed() -> None:
    tool(str(VENV / "bin" / "checkov"), "checkov", "run `make tools` (deploy/tools.sh)")
    start = time.monotonic()
    result = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - start < 5, "a second run must not reinstall"
    assert not result.stderr, "a second run should be silent"
