#!/usr/bin/env bash
# Issue 31's figures (BENCHMARKS.md): one pod, three dynamic objects, an hour of the driver's
# 1-minute republish at 60x (devkit/probes/lease_polls.py), today's code against BASE (the last
# commit before credentials with a lifetime), back to back in one run; outputs in $OUT.
#   devkit/probes/bench_leases.sh [OUT] [BASE]   (from the repository root, after `make install`)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-docs/bench}
BASE=${2:-aba5f3c}
mkdir -p "$OUT"
PY=$PWD/.venv/bin/python
WT=$(mktemp -d /tmp/bench-leases-base-XXXXXX)
git worktree add -q --detach "$WT" "$BASE"
trap 'git worktree remove --force "$WT"' EXIT
# The script is today's, run against the base's code (BASE has devkit/postgres.py, not this
# script, nor the devkit/probes package it now lives in).
mkdir -p "$WT/devkit/probes"
cp devkit/probes/__init__.py devkit/probes/lease_polls.py "$WT/devkit/probes/"
run() {  # name, then lease_polls flags
  local name=$1; shift
  echo "== $name (today): lease_polls $*"
  $PY -m devkit.probes.lease_polls "$@" --json | tee "$OUT/$name-today.json"
  echo "== $name (base $BASE)"
  (cd "$WT" && PYTHONPATH="$WT" $PY -m devkit.probes.lease_polls "$@" --json) | tee "$OUT/$name-base.json"
}
# An hour at a 1-minute republish: 1 h leases (24 h max), 24 h certificate, 1 h login token.
run s10-leases-hour --polls 60 --interval 1
# The same with a short login token (5 min, 20 min max): credentials re-issued with their token.
run s10-leases-short-token --polls 60 --interval 1 --token-ttl 5 --token-max-ttl 20
