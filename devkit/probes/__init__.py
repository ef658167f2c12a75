"""One-off experiments behind BENCHMARKS.md's figures: memory and cost probes, the scale model,
the outage soak and the scripts that re-run them. Tests do not import them (a few run one
briefly as a command, to keep it working); nothing else in the dev kit imports them either.

    held_memory       the Python heap a held credential keeps (issue 31)
    inflight_memory   RSS per Mount in flight in an outage, against a bare grpc server
    waiting_memory    our Python heap per Mount waiting out a store outage
    mount_cost        our Python per cached Mount, in one process, without gRPC
    lease_polls       one pod's dynamic objects polled as the driver republishes (issue 31)
    outage_soak       repeated store hangs against a served provider (RSS, answers; issue 21)
    scale_model       the cluster-scale model of BENCHMARKS.md ("Cluster scale")
    audit_bytes       audit trail bytes per poll: a selection against the same secrets listed
    bench_all.sh      re-runs every figure of BENCHMARKS.md's bench sections
    bench_leases.sh   issue 31's figures: lease_polls, today's code against a base commit

Each runs from the repository root as `python -m devkit.probes.<name>` (or
`devkit/probes/<script>.sh`).
"""
