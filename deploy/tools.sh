#!/usr/bin/env bash
# Install the scanners the deployment tests need into .tools/, apart from the project's venv:
# checkov pins an old boto3 that conflicts with the runtime dependencies (aiobotocore).
# Everything comes from deploy/checkov.lock (made by deploy/lock.sh): exact versions, each file
# checked against its sha256, wheels only, pip first as in `make install`.
# Idempotent: a stamp file records the lock it installed, so a second run returns at once, in
# silence; a changed lock reinstalls. A first run prints a line per step with its elapsed time.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lock="${root}/deploy/checkov.lock"
venv="${root}/.tools/checkov"
log="${root}/.tools/checkov-install.log"
python="${PYTHON:-python3}"

digest="$(sha256sum "${lock}" | cut -c1-16)"
stamp="${venv}/.installed-${digest}"
if [[ -f "${stamp}" && -x "${venv}/bin/checkov" ]]; then
    exit 0
fi

start=${SECONDS}
say() { echo "deploy/tools.sh: [$((SECONDS - start))s] $*" >&2; }
fail() {
    cat "${log}" >&2
    say "$1 failed (the log above is ${log})"
    exit 1
}

version="$(sed -n 's/^checkov==\([^ ]*\).*/\1/p' "${lock}")"
packages="$(grep -c '^[A-Za-z0-9]' "${lock}")"
say "installing checkov ${version} from deploy/checkov.lock (${packages} pins) into ${venv}"
rm -rf "${venv}"
mkdir -p "${root}/.tools"
"${python}" -m venv "${venv}"
pip=("${venv}/bin/python" -m pip install --require-hashes --only-binary :all: --no-deps)

# pip itself first, so the locked pip (not the one the Python came with) installs the rest.
say "installing the locked pip"
sed -n '/^pip==/,/[^\\]$/p' "${lock}" >"${venv}/pip.lock"
"${pip[@]}" --quiet -r "${venv}/pip.lock" >"${log}" 2>&1 || fail "installing pip"

# pip's own output (long, mostly index warnings) goes to the log; a line every 25 packages.
say "downloading and installing the pinned packages"
"${pip[@]}" --progress-bar off -r "${lock}" 2>&1 | tee -a "${log}" | {
    seen=0
    while IFS= read -r line; do
        case "${line}" in
            Collecting* | Processing*)
                seen=$((seen + 1))
                if ((seen % 25 == 0)); then say "  ${seen} of ${packages} fetched"; fi
                ;;
            "Installing collected packages"*) say "  unpacking ${seen} packages" ;;
        esac
    done
} || fail "pip install -r deploy/checkov.lock"

say "checking the environment"
"${venv}/bin/python" -m pip check >>"${log}" 2>&1 || fail "pip check"
"${venv}/bin/checkov" --version >>"${log}" 2>&1 || fail "checkov --version"
touch "${stamp}"
say "checkov ${version} installed"
