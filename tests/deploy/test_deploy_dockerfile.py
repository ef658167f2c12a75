"""The image: hadolint clean, multi-stage, installed from the committed lock, no pip, setuptools
or pbr in the final image, byte-code compiled at build time, and runs `serve`.

No container engine runs here, so the Dockerfile is read step by step: what each RUN installs,
from where, and in which stage. The locks themselves are checked against pyproject.toml and
against the environment the tests run in.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from backends.aws import refs
from tests.deploy.conftest import ROOT, tool

HADOLINT = ROOT / ".venv" / "bin" / "hadolint"
DOCKERFILE = ROOT / "Dockerfile"
RUNTIME_LOCK = ROOT / "requirements.lock"
TEST_LOCK = ROOT / "requirements-test.lock"
BUILD_LOCK = ROOT / "requirements-build.lock"
VENV = "/opt/secrets-bridge"
#: Never in the final image: installers and build tools (pbr and setuptools are declared by
#: hdrhistogram, which imports neither).
BUILD_ONLY = {"pip", "setuptools", "pbr", "wheel"}


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


def stages() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    steps = instructions()
    froms = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    assert len(froms) == 2
    return steps[froms[0] : froms[1]], steps[froms[1] :]


def commands(stage: list[tuple[str, str]]) -> list[list[str]]:
    """Every command of the stage's RUN steps (split at &&), as words."""
    return [
        shlex.split(part)
        for word, args in stage
        if word == "RUN"
        for part in args.split("&&")
        if part.strip()
    ]


def pip_calls(stage: list[tuple[str, str]]) -> list[list[str]]:
    """The arguments after `pip` of every pip command in the stage's RUN steps."""
    calls = []
    for words in commands(stage):
        if "pip" in words:
            calls.append(words[words.index("pip") + 1 :])
    return calls


def pins(lock: Path) -> dict[str, tuple[str, str]]:
    """name -> (version, marker) of every requirement in a lock; each one must carry hashes."""
    found: dict[str, tuple[str, str]] = {}
    for entry in re.split(r"\n(?=\S)", lock.read_text().replace("\\\n", " ")):
        if not entry.strip() or entry.lstrip().startswith("#"):
            continue
        text = entry.split("#", 1)[0]
        requirement, *options = text.split(" --hash=")
        req = Requirement(requirement.strip())
        assert options and all(o.startswith("sha256:") for o in options), f"no hashes: {entry}"
        (spec,) = req.specifier
        assert spec.operator == "==", f"not pinned: {entry}"
        found[canonicalize_name(req.name)] = (spec.version, str(req.marker or ""))
    assert found, f"{lock.name} locks nothing"
    return found


def declared(extra: str | None = None) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return [Requirement(r) for r in listed]


def test_hadolint_reports_nothing() -> None:
    hadolint = tool(str(HADOLINT), "hadolint", "run `make install`")
    result = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_two_stages_and_the_final_one_installs_nothing() -> None:
    build, final = stages()
    assert build[0][1].endswith(" AS build")
    copies = [args for word, args in final if word == "COPY"]
    assert copies == [f"--from=build {VENV} {VENV}"], "the final stage gets the environment only"
    for words in commands(final):
        assert not {"pip", "apt-get", "apt", "install"} & set(words), words


def test_base_is_slim_python_311_with_a_tag() -> None:
    (base,) = [args for word, args in instructions() if word == "ARG" and "PYTHON_IMAGE" in args]
    image = base.split("=", 1)[1]
    assert image.startswith("python:3.11") and "slim" in image, image


def test_every_install_comes_from_the_committed_lock() -> None:
    build, _ = stages()
    copied = [args.split()[:-1] for word, args in build if word == "COPY"]
    assert ["requirements-build.lock", "requirements.lock"] in copied
    calls = pip_calls(build)
    assert calls, "the build stage installs nothing"
    for call in calls:
        if "-r" in call:
            # A lock: exact versions, each file checked against its hash, no source builds.
            assert call[call.index("-r") + 1] in {"requirements.lock", "requirements-build.lock"}
            assert {"--require-hashes", "--only-binary=:all:"} <= set(call), call
        else:
            # Only the project's own wheel, built here, with nothing resolved or fetched.
            assert "--no-deps" in call, call
            assert "--no-index" in call or call[0] == "wheel", call
            assert call[-1] == "." or call[-1].startswith("/tmp/wheels/secrets_bridge-"), call
        assert not any("[" in word for word in call if not word.startswith("-")), "no extras"
    runtime = [c for c in calls if "requirements.lock" in c]
    assert runtime == [
        [
            "--python",
            f"{VENV}/bin/python",
            "install",
            "--no-cache-dir",
            "--no-compile",
            "--require-hashes",
            "--only-binary=:all:",
            "--no-deps",
            "-r",
            "requirements.lock",
        ]
    ]
    # The project's wheel is built by the locked backend, not one fetched for an isolated build.
    (wheel,) = [c for c in calls if c[0] == "wheel"]
    assert "--no-build-isolation" in wheel


def test_the_environment_has_no_pip_setuptools_or_pbr() -> None:
    build, final = stages()
    made = [w for w in commands(build) if w[1:3] == ["-m", "venv"]]
    assert made == [["python", "-m", "venv", "--without-pip", VENV]]
    assert not BUILD_ONLY & set(pins(RUNTIME_LOCK)), "the image's lock holds a build tool"
    # The base image's own copies go too, so nothing in the final image can install anything.
    (removal,) = [w for w in commands(final) if w[:2] == ["rm", "-rf"]]
    for name in ("pip", "setuptools", "wheel", "pkg_resources", "_distutils_hack"):
        assert f"$purelib/{name}" in removal, name
    assert "$stdlib/ensurepip/_bundled" in removal
    assert "$scripts/pip" in removal


def test_byte_code_is_compiled_at_build_time_for_the_environment_and_the_stdlib() -> None:
    build, final = stages()
    compiled = [w for w in commands(build) + commands(final) if "compileall" in w]
    for words in compiled:
        # Hash-based and unchecked: valid whatever times the files get, never recompiled; -f
        # rewrites any timestamp-based file an installer left.
        assert "-f" in words and "--invalidation-mode" in words
        assert words[words.index("--invalidation-mode") + 1] == "unchecked-hash"
    assert [w[-1] for w in compiled] == [VENV, "$stdlib"]
    # The environment is compiled after its last install and its last pruning, in the same RUN.
    last = [args for word, args in build if word == "RUN"][-1]
    assert last.rstrip().endswith(VENV) and "compileall" in last.split("&&")[-1]
    # The final stage's standard library: the base image deleted its byte-code.
    (final_run,) = [args for word, args in final if word == "RUN"]
    assert 'stdlib="$(python -c \'import sysconfig; print(sysconfig.get_path("stdlib"))\')"' in (
        final_run
    )


def test_the_botocore_models_kept_cover_every_service_the_aws_backend_calls() -> None:
    called = set(typing.get_args(refs.Service))
    for path in (ROOT / "backends" / "aws").glob("*.py"):
        called |= set(re.findall(r"_pool\.get\(\s*\"([a-z0-9-]+)\"", path.read_text()))
    assert {"secretsmanager", "ssm", "sts"} <= called
    (arg,) = [a for w, a in stages()[0] if w == "ARG" and a.startswith("BOTOCORE_SERVICES=")]
    kept = set(arg.split("=", 1)[1].strip('"').split())
    assert called <= kept, f"the image would lack the models of {called - kept}"
    # botocore's credential chain: SSO profiles and `aws login` create these clients.
    assert {"sso", "sso-oidc", "signin"} <= kept


def test_clients_load_from_the_models_the_image_keeps(tmp_path: Path) -> None:
    """botocore pruned as the Dockerfile prunes it still creates every client the backend does."""
    (arg,) = [a for w, a in stages()[0] if w == "ARG" and a.startswith("BOTOCORE_SERVICES=")]
    kept = set(arg.split("=", 1)[1].strip('"').split())
    spec = importlib.util.find_spec("botocore")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).parent

    def pruned(directory: str, names: list[str]) -> set[str]:
        if Path(directory) == source / "data":
            return {n for n in names if (source / "data" / n).is_dir() and n not in kept}
        return {"__pycache__"}

    shutil.copytree(source, tmp_path / "botocore", ignore=pruned)
    probe = (
        "import botocore.session, botocore.exceptions\n"
        f"assert botocore.__file__.startswith({str(tmp_path)!r}), botocore.__file__\n"
        "session = botocore.session.get_session()\n"
        "keys = dict(aws_access_key_id='AKIDEXAMPLE', aws_secret_access_key='x')\n"
        "for service in ('secretsmanager', 'ssm', 'sts'):\n"
        "    for region in ('eu-west-1', 'us-gov-west-1', 'cn-north-1'):\n"
        "        client = session.create_client(service, region_name=region, **keys)\n"
        "        print(service, region, client.meta.endpoint_url)\n"
        "try:\n"
        "    session.create_client('s3', region_name='eu-west-1', **keys)\n"
        "except botocore.exceptions.UnknownServiceError:\n"
        "    print('s3 pruned')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    ).stdout
    assert "secretsmanager eu-west-1 https://secretsmanager.eu-west-1.amazonaws.com" in out
    assert "sts cn-north-1 https://sts.cn-north-1.amazonaws.com.cn" in out
    assert out.rstrip().endswith("s3 pruned"), out


def test_the_image_runs_what_the_tests_ran() -> None:
    """requirements.lock is requirements-test.lock cut to the runtime: the same versions."""
    runtime, test = pins(RUNTIME_LOCK), pins(TEST_LOCK)
    assert {name: pin[0] for name, pin in runtime.items()} == {
        name: test[name][0] for name in runtime
    }
    assert BUILD_ONLY - {"wheel"} <= set(test), "the test environment's pip and setuptools"


def test_the_locks_satisfy_pyproject() -> None:
    """A dependency added or raised in pyproject.toml without deploy/lock.sh fails here."""
    for lock, wanted in (
        (RUNTIME_LOCK, declared()),
        (TEST_LOCK, declared() + declared("test")),
        (BUILD_LOCK, [Requirement(r) for r in build_requires()]),
    ):
        locked = pins(lock)
        for req in wanted:
            name = canonicalize_name(req.name)
            assert name in locked, f"{req} is not in {lock.name}: run deploy/lock.sh"
            assert req.specifier.contains(locked[name][0], prereleases=True), (
                f"{lock.name} has {name}=={locked[name][0]}, pyproject asks {req}: "
                "run deploy/lock.sh"
            )
    # The runtime lock is complete but for the two build tools hdrhistogram declares.
    closure = {canonicalize_name(r.name) for r in declared()}
    assert closure <= set(pins(RUNTIME_LOCK))


def build_requires() -> list[str]:
    requires: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"][
        "requires"
    ]
    return requires


def test_the_tests_run_on_the_locked_versions() -> None:
    """`make install` installed requirements-test.lock: what runs here is what is locked."""
    environment = default_environment()
    drifted = []
    for name, (version, marker) in pins(TEST_LOCK).items():
        if marker and not Requirement(f"{name}; {marker}").marker.evaluate(environment):  # type: ignore[union-attr]
            continue
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            drifted.append(f"{name}: not installed, locked {version}")
            continue
        if installed != version:
            drifted.append(f"{name}: installed {installed}, locked {version}")
    assert not drifted, "run `make install` (or deploy/lock.sh):\n" + "\n".join(drifted)


def test_make_install_installs_the_lock() -> None:
    recipe = (ROOT / "Makefile").read_text()
    assert "pip install --quiet --require-hashes -r requirements-test.lock" in recipe
    assert "pip install --quiet --no-deps --no-build-isolation -e ." in recipe
    assert "$(STAMP): pyproject.toml requirements-test.lock" in recipe


def test_the_image_runs_serve_as_non_root_by_default() -> None:
    steps = instructions()
    assert ("ENTRYPOINT", '["secrets-bridge"]') in steps
    assert ("CMD", '["serve"]') in steps
    (user,) = [args for word, args in steps if word == "USER"]
    assert not user.startswith("0") and not user.startswith("root")


def test_build_context_leaves_tests_and_deploy_out() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore, "everything is excluded unless listed"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert allowed == {
        "requirements.lock",
        "requirements-build.lock",
        "pyproject.toml",
        "README.md",
        "protos",
        "backends",
        "provider",
    }


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, TEST_LOCK, BUILD_LOCK], ids=lambda p: p.name)
def test_locks_are_generated_by_the_script(lock: Path) -> None:
    assert "#    deploy/lock.sh" in lock.read_text().splitlines()[1]
