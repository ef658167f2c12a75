"""Freshness with and without the change feed: a KV write in a real OpenBao → the first mount
answer carrying it, per pod, with driver-style polls (BENCHMARKS.md, issue 43).

    python -m devkit.probes.freshness --writes 40 --poll 2 [--pods 6 --window 20 --json FILE]

Two rigs of devkit/feedrig.py run side by side, each with its own OpenBao, API-server fake and
watcher, and get the same writes at the same random moments:

- **feed**: `serve --change-feed --feed-window 3600 --cache-ttl 0`, the class without a
  refreshInterval: every value is reused for the hour, and a change record drops it;
- **window**: no feed, `--cache-ttl W` (`--window`, 10 polls by default): a value is reused
  for W seconds whatever happens.

`--pods` pods (two service accounts, so two identities hold their own copies) poll every
`--poll` seconds, staggered evenly over the poll. Each write goes to a secret no earlier write is
still pending on. Per write: **freshness**, from the write to each pod's first answer carrying
the new value; and in the feed rig **propagation**, from the write to the node applying the
record (its `secrets_bridge_feed_changes_total` advancing, read every 0.1 s; one record per
write, in the order written). Freshness is at most propagation + one poll; at the driver's real
60 s poll it follows from the measured propagation alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from devkit.feedrig import FeedRig, feed_rig

#: Service accounts the rig's jwt role binds.
ACCOUNTS = ("app", "app2")


@dataclass
class Write:
    path: int
    value: str
    at: float = 0.0
    #: pod -> seconds from the write to its first answer carrying `value`.
    seen: dict[str, float] = field(default_factory=dict)
    propagated: float | None = None


@dataclass
class Side:
    """One rig and what its pods saw."""

    name: str
    rig: FeedRig
    writes: list[Write] = field(default_factory=list)

    def pending(self, pods: int) -> set[int]:
        return {w.path for w in self.writes if len(w.seen) < pods}


def nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50": nearest_rank(values, 0.50),
        "p99": nearest_rank(values, 0.99),
        "max": max(values),
    }


async def counter(rig: FeedRig, name: str) -> float:
    async with (
        aiohttp.ClientSession() as http,
        http.get(rig.provider.health + "/metrics") as response,
    ):
        found = re.search(rf"^{name} (\S+)$", await response.text(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def mount(rig: FeedRig, pod: str, account: str) -> dict[str, str]:
    response = await rig.provider.stub.Mount(rig.request(pod, account))
    if response.error.code:
        raise RuntimeError(f"{pod}: {response.error}")
    return {f.path: f.contents.decode() for f in response.files}


async def covered(rig: FeedRig) -> None:
    """Until the feed covers OpenBao (its source is up once Vault dialled the Lease holder):
    values read from then on get the feed's window."""
    deadline = time.monotonic() + 30
    while await counter(rig, "secrets_bridge_feed_covered") != 1.0:
        if time.monotonic() > deadline:
            raise RuntimeError("the feed never covered OpenBao")
        await mount(rig, "warm", ACCOUNTS[0])
        await asyncio.sleep(0.2)


async def poll(
    side: Side, pod: str, account: str, offset: float, every: float, done: asyncio.Event
) -> None:
    """One pod's polls, at `offset` within each poll, as the driver republishes a volume."""
    start = time.monotonic() + offset
    tick = 0
    while not done.is_set():
        await asyncio.sleep(max(0.0, start + tick * every - time.monotonic()))
        files = await mount(side.rig, pod, account)
        now = time.monotonic()
        for write in side.writes:
            if pod not in write.seen and files.get(f"o{write.path}") == write.value:
                write.seen[pod] = now - write.at
        tick += 1


async def propagation(side: Side, done: asyncio.Event) -> None:
    """The k-th advance of the node's applied records is the k-th write's record."""
    base = await counter(side.rig, "secrets_bridge_feed_changes_total")
    while not done.is_set():
        applied = int(await counter(side.rig, "secrets_bridge_feed_changes_total") - base)
        now = time.monotonic()
        for write in side.writes[:applied]:
            if write.propagated is None:
                write.propagated = now - write.at
        await asyncio.sleep(0.1)


async def writer(
    sides: Sequence[Side], args: argparse.Namespace, rng: random.Random, done: asyncio.Event
) -> None:
    """`--writes` writes at random moments (gaps uniform in 0.5..2.5 polls), each to a secret
    neither side still has pending, the same write to both sides; `done` once every pod saw
    every write (or the slowest could have: the window and three polls after the last)."""

    def free() -> set[int]:
        return set(range(args.paths)).difference(*(s.pending(args.pods) for s in sides))

    for n in range(1, args.writes + 1):
        await asyncio.sleep(rng.uniform(0.5, 2.5) * args.poll)
        while not free():
            await asyncio.sleep(0.1)
        path = rng.choice(sorted(free()))
        for side in sides:
            write = Write(path, f"s{path}-v{n}")
            side.writes.append(write)
            write.at = time.monotonic()
            await asyncio.to_thread(
                side.rig.bao.kv2_put, "secret", f"feed/s{path}", {"pw": write.value}
            )
    last = time.monotonic() + args.window + 3 * args.poll
    while len(free()) < args.paths and time.monotonic() < last:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # the propagation poller's last look
    done.set()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="freshness-") as tmp:
        work = Path(tmp)
        (work / "feed").mkdir()
        (work / "window").mkdir()
        async with (
            feed_rig(work / "feed", paths=args.paths, replicas=1, feed_window=3600.0) as fed,
            feed_rig(
                work / "window",
                paths=args.paths,
                replicas=1,
                cache_ttl=args.window,
                change_feed=False,
            ) as polled,
        ):
            await covered(fed)
            sides = [Side("feed", fed), Side("window", polled)]
            done = asyncio.Event()
            pods = [(f"p{i}", ACCOUNTS[i % len(ACCOUNTS)]) for i in range(args.pods)]
            async with asyncio.TaskGroup() as group:
                for side in sides:
                    for i, (pod, account) in enumerate(pods):
                        offset = i * args.poll / args.pods
                        group.create_task(poll(side, pod, account, offset, args.poll, done))
                group.create_task(propagation(sides[0], done))
                group.create_task(writer(sides, args, rng, done))
    result: dict[str, Any] = {"inputs": vars(args)}
    for side in sides:
        every_pod = [s for w in side.writes for s in w.seen.values()]
        first_pod = [min(w.seen.values()) for w in side.writes if w.seen]
        result[side.name] = {
            "freshness, every pod": summary(every_pod),
            "freshness, first pod": summary(first_pod),
            "not seen (write, pod)": sum(args.pods - len(w.seen) for w in side.writes),
        }
    propagated = [w.propagated for w in sides[0].writes if w.propagated is not None]
    result["feed"]["propagation"] = summary(propagated)
    return result


def table(result: dict[str, Any], poll: float, window: float) -> str:
    lines = [
        "| mode | measure | n | p50 (s) | p99 (s) | max (s) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    names = {"feed": "feed, --feed-window 3600", "window": f"no feed, --cache-ttl {window:g}"}
    for side, label in names.items():
        for measure, s in result[side].items():
            if isinstance(s, dict) and s.get("n"):
                lines.append(
                    f"| {label} | {measure} | {s['n']} | {s['p50']:.2f} | {s['p99']:.2f} "
                    f"| {s['max']:.2f} |"
                )
    p = result["feed"]["propagation"]
    if p.get("n"):
        lines.append("")
        lines.append(
            f"At the driver's 60 s poll, freshness <= propagation + one poll: p99 "
            f"<= {p['p99']:.2f} + 60 s, max <= {p['max']:.2f} + 60 s (goal: 60 + 5 s); "
            f"measured here with a {poll:g} s poll."
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writes", type=int, default=40)
    p.add_argument("--poll", type=float, default=2.0, help="seconds between a pod's polls")
    p.add_argument("--pods", type=int, default=6)
    p.add_argument("--paths", type=int, default=10, help="secrets in the class")
    p.add_argument("--window", type=float, default=0.0, help="no feed: --cache-ttl (10 polls)")
    p.add_argument("--seed", type=int, default=43)
    p.add_argument("--json", help="write the inputs and figures as JSON")
    args = p.parse_args()
    args.window = args.window or 10 * args.poll
    result = asyncio.run(run(args))
    print("inputs: " + ", ".join(f"{k}={v}" for k, v in vars(args).items()))
    print(table(result, args.poll, args.window))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
