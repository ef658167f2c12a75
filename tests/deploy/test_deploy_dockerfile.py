"""The image: hadolint clean, multi-stage, runtime dependencies only, runs `serve`."""

from __future__ import annotations

import subprocess

from tests.deploy.conftest import ROOT, tool

HADOLINT = ROOT / ".venv" / "bin" / "hadolint"
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = DOCKERFILE.read_text().replace("\\\n", " ")
    pairs = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def test_hadolint_reports_nothing() -> None:
    hadolint = tool(str(HADOLINT), "hadolint", "run `make install` (pip install -e '.[test]')")
    result = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_two_stages_and_the_final_one_only_copies_the_environment() -> None:
    steps = instructions()
    froms = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    assert len(froms) == 2
    assert steps[froms[0]][1].endswith(" AS build")
    final = steps[froms[1] :]
    assert not [args for word, args in final if word == "RUN"], "the final stage installs nothing"
    copies = [args for word, args in final if word == "COPY"]
    assert copies and all(c.startswith("--from=build ") for c in copies)


def test_base_is_slim_python_311_with_a_tag() -> None:
    (base,) = [args for word, args in instructions() if word == "ARG" and "PYTHON_IMAGE" in args]
    image = base.split("=", 1)[1]
    assert image.startswith("python:3.11") and "slim" in image, image


def test_installs_the_project_without_extras_and_runs_serve() -> None:
    steps = instructions()
    runs = " ".join(args for word, args in steps if word == "RUN")
    assert "pip install --no-cache-dir ." in runs
    assert "[" not in runs, "runtime image must not install extras (test, plot)"
    assert ("ENTRYPOINT", '["secrets-bridge"]') in steps
    assert ("CMD", '["serve"]') in steps
    (user,) = [args for word, args in steps if word == "USER"]
    assert not user.startswith("0") and not user.startswith("root")


def test_build_context_leaves_tests_and_deploy_out() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore, "everything is excluded unless listed"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "protos", "backends", "provider"}
