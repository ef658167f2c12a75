#!/usr/bin/env bash
# Every figure of BENCHMARKS.md's bench sections, one command each; outputs in $OUT.
#   devkit/probes/bench_all.sh [OUT]   (from the repository root, after `make install`;
#                                      the soak alone takes 10 minutes)
# On a shared machine the ratios move by tens of percent between runs: run it on a quiet one.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-docs/bench}
mkdir -p "$OUT"
PY=.venv/bin/python
bench() { local name=$1; shift; echo "== $name: bench $*"; $PY -m provider.cli.main bench "$@" --json "$OUT/$name.json" | tee "$OUT/$name.txt"; }

# The floor: cached 5-object mounts, closed loop, against the echo (CPU per call and p50 ratios).
bench cached-fake --store fake --objects 5 --cache-ttl 30 --concurrency 16 --duration 30
bench cached-openbao --store openbao --objects 5 --cache-ttl 30 --concurrency 16 --duration 30
# The same against a floor on uvloop too (the provider's own loop): our code's share of the ratio.
bench cached-fake-floor-uvloop --store fake --objects 5 --cache-ttl 30 --concurrency 16 --duration 30 --floor-loop uvloop
# Open loop: 500 cached mounts per second for 60 s (0 errors, p99 <= 20 ms).
bench open-500-fake --store fake --objects 5 --cache-ttl 30 --rate 500 --duration 60
bench open-500-openbao --store openbao --objects 5 --cache-ttl 30 --rate 500 --duration 60
# Rotation steady state, value cache off (the uncached mount's cost).
bench rotation-fake --store fake --scenario rotation --volumes 1000 --interval 10 --duration 30
# A rollout: 500 pods of one class at once, cold (store calls counted by the store).
bench cold-500-openbao-ttl30 --store openbao --mounts 500 --concurrency 500 --cold --no-echo --cache-ttl 30
bench cold-500-moto-ttl30 --store moto --mounts 500 --concurrency 500 --cold --no-echo --cache-ttl 30
# Soak: 10-minute rotation, 2,000 volumes every 60 s, OpenBao killed every 2 minutes (down 5 s);
# with serve-stale on (expect 0 failed mounts), then off (failures only during outages).
bench soak-stale-on --store openbao --scenario rotation --volumes 2000 --interval 60 --duration 600 \
  --store-restart-every 120 --store-down 5 --no-echo --timeout 30 --provider-arg=--serve-stale-max-age=600 || true
bench soak-stale-off --store openbao --scenario rotation --volumes 2000 --interval 60 --duration 600 \
  --store-restart-every 120 --store-down 5 --no-echo --timeout 30 || true
# The provider's own Python per cached Mount, in one process (no gRPC): a line per mount, then
# the default (a volume's unchanged re-mounts counted, not logged); then the Vault backend
# against a real OpenBao.
$PY -m devkit.probes.mount_cost --log-repeats-every 0 | tee "$OUT/mount-cost.txt"
$PY -m devkit.probes.mount_cost | tee -a "$OUT/mount-cost.txt"
$PY -m devkit.probes.mount_cost --store openbao | tee -a "$OUT/mount-cost.txt"
# Our Python heap per mount waiting out an outage (a store cut off, 300 mounts waiting).
$PY -m devkit.probes.waiting_memory | tee "$OUT/waiting-memory.txt"
# RSS per call in flight: the provider waiting out an outage vs a bare grpc server holding calls.
$PY -m devkit.probes.inflight_memory --pairs 5 --calls 300 | tee "$OUT/inflight-memory.txt"
# Memory with all four backends after 20,000 mounts.
$PY -m tests.perf.rss_all_backends --mounts 20000 --every 5000 | tee "$OUT/rss-all-four.txt"
# The cluster-scale model (its measured inputs name the runs above).
$PY -m devkit.probes.scale_model --json "$OUT/scale-model.json" | tee "$OUT/scale-model.txt"
