#!/usr/bin/env bash
# Install the scanners the deployment tests need into .tools/, apart from the project's venv:
# checkov pins an old boto3 that conflicts with the runtime dependencies (aiobotocore).
# Idempotent: a stamp file records the installed version, so a second run returns at once.
set -euo pipefail

CHECKOV_VERSION="3.3.30"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${root}/.tools/checkov"
stamp="${venv}/.installed-${CHECKOV_VERSION}"
python="${PYTHON:-python3}"

if [[ -f "${stamp}" && -x "${venv}/bin/checkov" ]]; then
    exit 0
fi

echo "deploy/tools.sh: installing checkov ${CHECKOV_VERSION} into ${venv}" >&2
rm -rf "${venv}"
"${python}" -m venv "${venv}"
log="${root}/.tools/checkov-install.log"
# pip's output goes to a log (it is long and mostly index warnings); shown only on failure.
if ! "${venv}/bin/python" -m pip install --quiet "checkov==${CHECKOV_VERSION}" >"${log}" 2>&1; then
    cat "${log}" >&2
    echo "deploy/tools.sh: pip install checkov==${CHECKOV_VERSION} failed" >&2
    exit 1
fi
"${venv}/bin/checkov" --version >/dev/null
touch "${stamp}"
