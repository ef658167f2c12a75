#!/usr/bin/env bash
# Regenerate the committed locks from pyproject.toml, with every file's sha256:
#   requirements.lock        the runtime dependencies: what the image installs (Dockerfile)
#   requirements-test.lock   the runtime and test dependencies, pip and setuptools: what
#                            `make install` (so CI's `make test`) installs
#   requirements-build.lock  pip and the build backend (pyproject's [build-system]): what
#                            installs the lock and builds the project's wheel in the image
#   deploy/checkov.lock      pip and checkov, resolved on their own (checkov pins an old boto3
#                            that conflicts with the runtime): what deploy/tools.sh installs
# The versions already locked are kept unless asked: `deploy/lock.sh --upgrade` (everything) or
# `deploy/lock.sh --upgrade-package grpcio` (one). Then `make install` and the tests, and commit
# the four files together (checkov moves with CHECKOV_VERSION below). uv runs from its own
# virtual environment in .tools/, apart from the project's; it resolves for Linux, macOS and
# Windows at once (--universal), for Python 3.11.
set -euo pipefail

UV_VERSION="0.13.9"
PYTHON_VERSION="3.11"
# The installer, locked too: `make install` and the image's build stage run this pip. Neither pip
# nor the build backend is in the image.
PIP_VERSION="26.3"
# The manifest scanner the deployment tests run (deploy/tools.sh installs it into .tools/checkov).
CHECKOV_VERSION="3.3.30"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${root}/.tools/uv"
python="${PYTHON:-python3}"
if [[ ! -x "${venv}/bin/uv" ]] || ! "${venv}/bin/uv" --version | grep -qx "uv ${UV_VERSION}.*"; then
    rm -rf "${venv}"
    "${python}" -m venv "${venv}"
    "${venv}/bin/python" -m pip install --quiet "uv==${UV_VERSION}"
fi
uv="${venv}/bin/uv"
cd "${root}"

compile() {
    "${uv}" pip compile --quiet --universal --python-version "${PYTHON_VERSION}" \
        --generate-hashes --no-config --custom-compile-command "deploy/lock.sh" "$@"
}

# The test lock first: the runtime lock takes the same versions from it, so the image runs what
# the tests ran.
echo "pip==${PIP_VERSION}" | compile pyproject.toml - --extra test -o requirements-test.lock "$@"

# hdrhistogram (the bench's histograms) declares pbr and setuptools as run-time dependencies but
# imports neither; the image installs the lock with --no-deps, so leaving them out of the lock
# leaves them out of the image (tests/deploy/test_deploy_dockerfile.py checks both).
compile pyproject.toml -c requirements-test.lock \
    --no-emit-package pbr --no-emit-package setuptools -o requirements.lock "$@"

# The image's build stage: pip (the installer) and the build backend, from pyproject's
# [build-system] requires.
{
    echo "pip==${PIP_VERSION}"
    "${python}" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")'
} | compile - -c requirements-test.lock -o requirements-build.lock "$@"

# The scanner's own environment: no constraint from the project's locks, which it conflicts with.
printf 'pip==%s\ncheckov==%s\n' "${PIP_VERSION}" "${CHECKOV_VERSION}" |
    compile - -o deploy/checkov.lock "$@"
