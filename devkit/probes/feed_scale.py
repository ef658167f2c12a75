"""Store reads at cluster scale with and without the change feed: many node providers as
processes, one OpenBao, the feed's watcher; then the scale model fed with the measured rates
(BENCHMARKS.md, issue 43).

    python -m devkit.probes.feed_scale [--nodes 20 --pods 10 --accounts 3 --objects 5
                                        --factor 30 --changes 10 --json FILE]

Time is compressed by `--factor`: with 30, the driver's 60 s poll is 2 s, an hour 120 s,
`--cache-ttl 30` 1 s, the feed's 1 h window 120 s, its 30 s heartbeat 1 s and 90 s staleness 3 s,
the Vault tokens' 1 h TTL 120 s. Every node is `secrets-bridge serve` in its own process on its
own socket; OpenBao (devkit/feedrig.py: its socket audit device to the Lease holder), the
API-server fake and one watcher replica run here, and so do the node's pods: `--pods` pods per
node over `--accounts` service accounts, one class of `--objects` KV v2 secrets, each pod
re-sending its one request every poll through the driver's gRPC, staggered over the poll.

Modes, one after another, each with its own fresh nodes:

- **feed**: `--change-feed --feed-window <1 h>` (the class sets no refreshInterval);
- **ttl**: `--cache-ttl <30 s>`, no feed;
- **none**: no cache, no feed.

Each mode has a steady phase, then one with `--changes` KV writes per scaled hour (evenly spaced,
to random secrets of the class). The feed's phases are a scaled hour each (its window must expire
once inside); the polling modes' are `--sample` of an hour (their reads come at the polls' even
rate). Store calls are counted by OpenBao's file audit device (responses, the root token's own
writes left out): reads of the class's paths, logins, the rest. Figures are per scaled hour, i.e.
per real hour at the uncompressed rates. CPU: user + system seconds from /proc of OpenBao, of all
nodes together, and of this process (the watcher, the API fake and the pods' gRPC client).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from backends.aws.changes import WAIT_SECONDS as SQS_WAIT
from backends.azure.changes import POLL as STORAGE_QUEUE_POLL
from backends.gcp.changes import PULL_TIMEOUT as PUBSUB_PULL
from devkit.feedrig import NAMESPACE, FeedRig, feed_rig
from devkit.ports import free_port
from devkit.probes.scale_model import NODES, QUOTAS, Inputs, over
from devkit.served_process import ProviderProcess, provider_process
from devkit.serving import driver_channel
from protos import provider_pb2_grpc
from provider.cli.bench.stats import proc_usage
from provider.watch.run import LEASE_NAME

MODES = ("feed", "ttl", "none")
ACCOUNTS = ("app", "app2", "app3")
HOUR = 3600.0
#: The watcher's Lease renewals a real hour (--lease-duration 15: renewed every retry period, 2 s).
LEASE_RENEWALS = HOUR / 2


@dataclass
class Phase:
    mode: str
    phase: str
    seconds: float
    changes: int
    mounts: int
    mount_errors: int
    reads: int
    logins: int
    other_calls: int
    bao_cpu: float
    nodes_cpu: float
    probe_cpu: float
    kube_updates: int
    records_updates: int
    lease_acquired: int
    watch_events: int

    def per_hour(self, count: float, hour: float) -> float:
        return count * hour / self.seconds


class Node:
    """One node: its provider process and its pods' requests, re-sent unchanged every poll."""

    def __init__(self, process: ProviderProcess, health: str, requests: list[Any]) -> None:
        self.process, self.health, self.requests = process, health, requests
        self.channel = driver_channel(process.socket)
        self.stub = provider_pb2_grpc.CSIDriverProviderStub(self.channel)


@dataclass
class Tally:
    mounts: int = 0
    errors: int = 0


def node_flags(mode: str, rig: FeedRig, work: Path, factor: float, health_port: int) -> list[str]:
    flags = [
        f"--vault-addr={rig.bao.addr}",
        # provider_process picks a health port of its own; the last flag wins, and this one
        # is known here (the feed's cover is read from its /metrics).
        f"--health-addr=127.0.0.1:{health_port}",
    ]
    if mode == "feed":
        flags += [
            "--change-feed",
            f"--feed-window={HOUR / factor:g}",
            f"--feed-stale-after={90 / factor:g}",
            f"--feed-namespace={NAMESPACE}",
            f"--kube-api-url={rig.kube.url}",
            f"--kube-api-token-file={work / 'kube-token'}",
        ]
    elif mode == "ttl":
        flags.append(f"--cache-ttl={30 / factor:g}")
    return flags


async def metric(node: Node, name: str) -> float:
    def scrape() -> str:
        with urllib.request.urlopen(node.health + "/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    for line in (await asyncio.to_thread(scrape)).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


async def ready(nodes: Sequence[Node], mode: str) -> None:
    """Every node answers (and, with the feed, covers OpenBao: values read then get the
    window); a pod mount each meanwhile, which also makes Vault dial the audit stream."""
    deadline = time.monotonic() + 90
    for node in nodes:
        while True:
            try:
                await node.stub.Mount(node.requests[0], timeout=10)
                if mode != "feed" or await metric(node, "secrets_bridge_feed_covered") == 1.0:
                    break
            except Exception:  # not serving yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {node.process.socket} not ready: see {node.process.log}")
            await asyncio.sleep(0.3)


async def pod(node: Node, request: Any, offset: float, poll: float, tally: Tally) -> None:
    """One pod's polls until cancelled, at `offset` within each poll."""
    start = time.monotonic() + offset
    tick = 0
    while True:
        await asyncio.sleep(max(0.0, start + tick * poll - time.monotonic()))
        tick += 1
        try:
            response = await node.stub.Mount(request, timeout=poll * 5)
            tally.mounts += 1
            tally.errors += bool(response.error.code)
        except Exception:  # counted: a node too slow for the poll
            tally.errors += 1


async def feed_writes(rig: FeedRig, counted: list[int]) -> None:
    """Counts the records ConfigMap's versions and the Lease's acquisitions (a watcher that
    lost it and took it again: a new generation, every node covering its values anew), looked
    at every 50 ms (a records write coalesces 0.5 s of changes: none is missed)."""
    looked = [
        (f"/api/v1/namespaces/{NAMESPACE}/configmaps", "secrets-bridge-feed-vault", "metadata"),
        (f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", LEASE_NAME, "spec"),
    ]
    key = {"metadata": "resourceVersion", "spec": "acquireTime"}
    last: list[Any] = [None, None]
    while True:
        for i, (collection, name, part) in enumerate(looked):
            now = (rig.kube.object(collection, name) or {}).get(part, {}).get(key[part])
            if now != last[i]:
                counted[i] += last[i] is not None
                last[i] = now
        await asyncio.sleep(0.05)


def store_calls(rig: FeedRig) -> tuple[int, int, int]:
    reads = logins = other = 0
    for (operation, path), n in rig.bao.audit_counts().items():
        if operation == "read" and path.startswith("secret/data/feed/"):
            reads += n
        elif path.startswith("auth/jwt/login"):
            logins += n
        else:
            other += n
    return reads, logins, other


async def measure(
    mode: str,
    phase: str,
    seconds: float,
    changes: int,
    rig: FeedRig,
    nodes: Sequence[Node],
    tally: Tally,
    rng: random.Random,
) -> Phase:
    pids = [n.process.pid for n in nodes]
    bao, me = rig.bao.process.pid, os.getpid()
    nodes_cpu = sum(proc_usage(p).cpu_seconds for p in pids)
    bao_cpu, probe_cpu = proc_usage(bao).cpu_seconds, proc_usage(me).cpu_seconds
    mounts, errors = tally.mounts, tally.errors
    updates, events = rig.kube.requests["update"], sum(rig.kube.events_sent)
    counted = [0, 0]
    rig.bao.audit_mark()
    watcher = asyncio.create_task(feed_writes(rig, counted))
    start = time.monotonic()
    for k in range(changes):  # evenly spaced over the phase
        await asyncio.sleep(max(0.0, start + (k + 0.5) * seconds / changes - time.monotonic()))
        name = rng.randrange(len(rig.paths))
        await asyncio.to_thread(
            rig.bao.kv2_put, "secret", f"feed/s{name}", {"pw": f"{phase}-{k}-{rng.random()}"}
        )
    await asyncio.sleep(max(0.0, start + seconds - time.monotonic()))
    watcher.cancel()
    reads, logins, other = store_calls(rig)
    return Phase(
        mode,
        phase,
        time.monotonic() - start,
        changes,
        tally.mounts - mounts,
        tally.errors - errors,
        reads,
        logins,
        other,
        proc_usage(bao).cpu_seconds - bao_cpu,
        sum(proc_usage(p).cpu_seconds for p in pids) - nodes_cpu,
        proc_usage(me).cpu_seconds - probe_cpu,
        rig.kube.requests["update"] - updates,
        counted[0],
        counted[1],
        sum(rig.kube.events_sent) - events,
    )


async def run_mode(
    mode: str, rig: FeedRig, work: Path, args: argparse.Namespace, rng: random.Random
) -> list[Phase]:
    poll, hour = 60 / args.factor, HOUR / args.factor
    sample = hour if mode == "feed" else hour * args.sample
    accounts = ACCOUNTS[: args.accounts]
    with contextlib.ExitStack() as stack:
        nodes: list[Node] = []
        for i in range(args.nodes):
            port = free_port()
            flags = node_flags(mode, rig, work, args.factor, port)
            process = stack.enter_context(provider_process(work / f"{mode}-{i}", *flags))
            requests = [
                rig.request(f"n{i}-p{j}", accounts[j % len(accounts)]) for j in range(args.pods)
            ]
            nodes.append(Node(process, f"http://127.0.0.1:{port}", requests))
        try:
            await ready(nodes, mode)
            tally = Tally()
            total = args.nodes * args.pods
            pods = [
                asyncio.create_task(
                    pod(node, request, (i * args.pods + j) * poll / total, poll, tally)
                )
                for i, node in enumerate(nodes)
                for j, request in enumerate(node.requests)
            ]
            await asyncio.sleep(2 * poll)  # every pod's first mount, cold
            steady = await measure(mode, "steady", sample, 0, rig, nodes, tally, rng)
            changes = round(args.changes * sample / hour)
            changed = await measure(mode, "changes", sample, changes, rig, nodes, tally, rng)
            for task in pods:
                task.cancel()
            await asyncio.gather(*pods, return_exceptions=True)
            return [steady, changed]
        finally:
            for node in nodes:
                await node.channel.close()


async def run(args: argparse.Namespace) -> list[Phase]:
    rng = random.Random(args.seed)
    phases: list[Phase] = []
    with tempfile.TemporaryDirectory(prefix="feed-scale-") as tmp:
        work = Path(tmp)
        async with feed_rig(
            work,
            paths=args.objects,
            replicas=1,
            heartbeat=30 / args.factor,
            stale_after=90 / args.factor,
        ) as rig:
            # Tokens live a scaled hour, for the accounts the pods use.
            rig.bao.add_jwt_role(
                "jwt",
                "feed",
                namespace="feed",
                service_account=list(ACCOUNTS),
                policies=["feed"],
                ttl=f"{HOUR / args.factor:g}s",
            )
            for mode in args.modes.split(","):
                phases += await run_mode(mode, rig, work, args, rng)
    return phases


def tables(phases: Sequence[Phase], args: argparse.Namespace) -> str:
    hour = HOUR / args.factor
    lines = [
        f"Per scaled hour ({hour:g} s here = one real hour), {args.nodes} nodes x {args.pods} "
        f"pods, {args.accounts} identities a node, {args.objects} objects:",
        "",
        "| mode | phase | changes/h | mounts/h | errors | reads/h | logins/h | other/h "
        "| reads/node/h | OpenBao CPU s/h | nodes CPU s/h | probe CPU s/h |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in phases:
        h = p.per_hour
        lines.append(
            f"| {p.mode} | {p.phase} | {h(p.changes, hour):.0f} | {h(p.mounts, hour):,.0f} "
            f"| {p.mount_errors} | {h(p.reads, hour):,.0f} | {h(p.logins, hour):,.0f} "
            f"| {h(p.other_calls, hour):,.0f} | {h(p.reads, hour) / args.nodes:,.1f} "
            f"| {h(p.bao_cpu, hour):.1f} | {h(p.nodes_cpu, hour):.1f} "
            f"| {h(p.probe_cpu, hour):.1f} |"
        )
    feed = [p for p in phases if p.mode == "feed"]
    if feed:
        lines += [
            "",
            "The feed's own cost, per scaled hour (measured, API-server fake):",
            "",
            "| phase | API updates/h (Lease, heartbeat, records) | records updates/h "
            "| watch events sent/h (all watches) | Lease taken anew |",
            "|---|---:|---:|---:|---:|",
        ]
        for p in feed:
            h = p.per_hour
            lines.append(
                f"| {p.phase} | {h(p.kube_updates, hour):,.0f} | {h(p.records_updates, hour):,.0f} "
                f"| {h(p.watch_events, hour):,.0f} | {p.lease_acquired} |"
            )
    lines += ["", model(phases, args)]
    return "\n".join(lines)


def model(phases: Sequence[Phase], args: argparse.Namespace) -> str:
    """devkit/probes/scale_model.py's sizes and quotas, with the measured reads per node: as
    measured, and scaled to the model's node (its pods and identities a node: a cache's reads
    follow the identities, no cache's the pods)."""
    hour, shape = HOUR / args.factor, Inputs()
    lines = [
        "Store reads/s at cluster size from the measured reads per node, against the scale "
        f"model's default quotas; as measured ({args.pods} pods, {args.accounts} identities a "
        f"node) and scaled to the model's node ({shape.pods_per_node} pods, "
        f"{shape.identities_per_node} identities: feed and ttl by identities, none by pods):",
        "",
        "| nodes | mode | phase | reads/s | logins/s | over the quota of "
        "| reads/s, model's node | over the quota of |",
        "|---:|---|---|---:|---:|---|---:|---|",
    ]
    for nodes in NODES:
        for p in phases:
            reads = p.per_hour(p.reads, hour) / args.nodes * nodes / HOUR
            logins = p.per_hour(p.logins, hour) / args.nodes * nodes / HOUR
            scale = (
                shape.pods_per_node / args.pods
                if p.mode == "none"
                else shape.identities_per_node / args.accounts
            )
            lines.append(
                f"| {nodes:,} | {p.mode} | {p.phase} | {reads:,.2f} | {logins:,.2f} "
                f"| {', '.join(over(reads)) or '-'} | {reads * scale:,.1f} "
                f"| {', '.join(over(reads * scale)) or '-'} |"
            )
    changes = args.changes
    lines += [
        "",
        "The feed's own cost a real hour (independent of node count unless said): "
        f"Vault's audit stream is pushed (no polls); an SQS long poll every {SQS_WAIT} s is "
        f"{HOUR / SQS_WAIT:.0f} ReceiveMessage/h idle, a Storage queue polled every "
        f"{STORAGE_QUEUE_POLL:g} s {HOUR / STORAGE_QUEUE_POLL:.0f} receives/h, a Pub/Sub pull "
        f"of up to {PUBSUB_PULL:g} s at least {HOUR / PUBSUB_PULL:.0f} Pulls/h; plus one delete "
        f"or acknowledge per batch. Kubernetes: {LEASE_RENEWALS:.0f} Lease renewals/h, "
        f"120 heartbeat updates/h (--heartbeat 30) and one records update per change batch "
        f"(<= {changes}/h here), each delivered to every node's watch:",
        "",
        "| nodes | watch events/h (heartbeat + records) | per second |",
        "|---:|---:|---:|",
    ]
    for nodes in NODES:
        events = nodes * (120 + changes)
        lines.append(f"| {nodes:,} | {events:,} | {events / HOUR:,.1f} |")
    quotas = "; ".join(f"{k}: {v:,}/s" for k, v in QUOTAS.items() if v)
    lines += ["", f"Quotas (devkit/probes/scale_model.py): {quotas}."]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--pods", type=int, default=10, help="pods per node")
    p.add_argument("--accounts", type=int, default=3, choices=range(1, len(ACCOUNTS) + 1))
    p.add_argument("--objects", type=int, default=5, help="secrets in the class")
    p.add_argument("--factor", type=float, default=30.0, help="time compression")
    p.add_argument("--changes", type=int, default=10, help="KV writes per scaled hour")
    p.add_argument(
        "--sample", type=float, default=1 / 3, help="polling modes' phases, in scaled hours"
    )
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated: feed, ttl, none")
    p.add_argument("--seed", type=int, default=43)
    p.add_argument("--json", help="write the inputs and phases as JSON")
    args = p.parse_args()
    phases = asyncio.run(run(args))
    print("inputs: " + ", ".join(f"{k}={v}" for k, v in vars(args).items()))
    print(tables(phases, args))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"inputs": vars(args), "phases": [asdict(p) for p in phases]}, indent=1)
        )


if __name__ == "__main__":
    main()
