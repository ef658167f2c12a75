"""Cluster scale on paper: store calls and pod-start latency for 100 / 1,000 / 5,000 nodes.

    python -m devkit.probes.scale_model [--pods-per-node 30 --objects 5 --interval 120
                                  --identities-per-node 10 --cache-ttl 30 --json FILE]

Prints the tables of BENCHMARKS.md ("Cluster scale"). Three policies:

- upstream: one login and one read per object per pod per rotation poll, objects read one
  after another (the upstream providers' behaviour);
- ours, defaults: credentials cached per identity and node (one login per identity per
  credential lifetime); value cache off, so a poll still reads every object, in parallel;
  AWS confirms a held value with DescribeSecret (its own, 4x larger quota) within
  --revalidate-max-age instead of reading it;
- ours, --cache-ttl: one read per object per identity per node per poll, as long as one poll
  pass over a node's volumes takes less than the TTL (the driver polls a node's volumes in one
  pass; single-flight joins the pods that ask at once).

Rollout: every pod of every node starts at once (cold). Measured on one node
(`BENCHMARKS.md`, run "cold-500"): 500 concurrent mounts of one class and identity cost one
login and one read per object, so a node costs identities x (1 + objects) calls.

Latency: the provider's own time (measured) plus store round trips on the critical path x an
assumed round-trip time (an input: your store's, not measured here).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

NODES = (100, 1_000, 5_000)

#: Published default quotas, calls per second (per account/project/vault and region).
QUOTAS = {
    "AWS Secrets Manager (GetSecretValue)": 10_000,
    "AWS Secrets Manager (DescribeSecret)": 40_000,
    "Azure Key Vault (secret GETs, per vault)": 400,  # 4,000 per 10 s
    "Google Secret Manager (access, per project)": 1_500,  # 90,000 per minute
    "Vault / OpenBao": None,  # no built-in quota: your cluster's capacity (and rate-limit quotas)
}

#: Measured inputs, each with the run it came from (BENCHMARKS.md lists the commands).
MEASURED = {
    "cached_mount_ms": (1.35, "s4-open-500-fake: p50 of a cached 5-object mount at 500/s"),
    "uncached_mount_overhead_ms": (2.7, "rotation-fake: p50 of a value-cache-off mount, 100/s"),
    "cold_calls_per_node_identity": ("1 login + 1 read per object", "cold-500-openbao-ttl30"),
}


@dataclass(frozen=True)
class Inputs:
    pods_per_node: int = 30
    objects: int = 5
    interval: float = 120.0
    identities_per_node: int = 10
    credential_lifetime: float = 3600.0
    cache_ttl: float = 30.0
    store_rtt_ms: float = 10.0  # an assumption: the store's round trip from a node


@dataclass(frozen=True)
class Row:
    policy: str
    nodes: int
    logins_per_s: float
    reads_per_s: float
    rollout_calls: int
    pod_start_ms: float
    poll_mount_ms: float


def model(i: Inputs, nodes: int) -> list[Row]:
    pods = nodes * i.pods_per_node
    ids = nodes * min(i.identities_per_node, i.pods_per_node)
    cached, uncached = MEASURED["cached_mount_ms"][0], MEASURED["uncached_mount_overhead_ms"][0]
    rtt = i.store_rtt_ms
    assert isinstance(cached, float) and isinstance(uncached, float)
    return [
        Row(
            "upstream",
            nodes,
            pods / i.interval,
            pods * i.objects / i.interval,
            pods * (1 + i.objects),
            uncached + (1 + i.objects) * rtt,
            uncached + (1 + i.objects) * rtt,
        ),
        Row(
            "ours, defaults",
            nodes,
            ids / i.credential_lifetime,
            pods * i.objects / i.interval,
            ids * (1 + i.objects),
            uncached + 2 * rtt,
            uncached + rtt,
        ),
        Row(
            f"ours, --cache-ttl {i.cache_ttl:g}",
            nodes,
            ids / i.credential_lifetime,
            ids * i.objects / max(i.interval, i.cache_ttl),
            ids * (1 + i.objects),
            uncached + 2 * rtt,
            cached,
        ),
    ]


def over(reads_per_s: float) -> list[str]:
    return [name for name, q in QUOTAS.items() if q is not None and reads_per_s > q]


def table(i: Inputs) -> str:
    lines = [
        "| nodes | policy | logins/s | reads/s | rollout: calls | pod start (ms) "
        "| poll mount (ms) | over the quota of |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for nodes in NODES:
        for r in model(i, nodes):
            quota = ", ".join(over(r.reads_per_s)) or "-"
            lines.append(
                f"| {nodes:,} | {r.policy} | {r.logins_per_s:,.1f} | {r.reads_per_s:,.1f} "
                f"| {r.rollout_calls:,} | {r.pod_start_ms:.0f} | {r.poll_mount_ms:.1f} "
                f"| {quota} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in Inputs.__dataclass_fields__.values():
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    p.add_argument("--json", help="write inputs and rows as JSON")
    args = p.parse_args()
    i = Inputs(**{k: getattr(args, k) for k in Inputs.__dataclass_fields__})
    print("inputs: " + ", ".join(f"{k}={v:g}" for k, v in asdict(i).items()))
    print("measured: " + "; ".join(f"{k}={v} ({run})" for k, (v, run) in MEASURED.items()))
    print(table(i))
    if args.json:
        rows = [asdict(r) for n in NODES for r in model(i, n)]
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"inputs": asdict(i), "measured": MEASURED, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
