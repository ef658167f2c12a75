"""`secrets-bridge bench`: pick the target, run the floor and the provider with the same load,
and report what each cost.

The target is a provider already serving or one the bench starts (provider/cli/bench/servers.py).
Unless `--cold`, one probe mount goes first: it fails the run early with the provider's own
message when the class or the tokens are wrong, and its answer is what the floor serves, so both
servers send the same files. Then each server gets the same load in turn (floor first), from
client processes (`load`), and its CPU time is read from the OS (or /metrics) at the start and
end of the measured phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provider.cli.bench import load, stats
from provider.cli.bench.servers import Target, floor, probe, remote, started
from provider.cli.bench.summary import phase_summary, soak_summary


def shape_of(args: argparse.Namespace) -> tuple[load.Shape, int]:
    """The load shape and the number of distinct pods (volumes) it cycles over."""
    warmup = 0.0 if args.cold else args.warmup
    pods = args.pods
    if args.scenario == "rotation":
        pods = args.volumes or args.pods
        duration = args.duration or 3 * args.interval
        rate = pods / args.interval
        return load.Shape(
            "open",
            rate=rate,
            duration=duration,
            warmup=warmup,
            timeout=args.timeout,
            mounts=args.mounts,
        ), pods
    mounts, duration = args.mounts, args.duration
    if not mounts and not duration:
        mounts, duration = (0, 10.0) if args.rate else (2000, 0.0)
    if args.rate:
        return load.Shape(
            "open",
            rate=args.rate,
            mounts=mounts,
            duration=duration,
            warmup=warmup,
            timeout=args.timeout,
        ), pods
    return load.Shape(
        "closed",
        concurrency=args.concurrency,
        mounts=mounts,
        duration=duration,
        warmup=warmup,
        timeout=args.timeout,
    ), pods


UsageFn = Callable[[], stats.Usage | None]


def usage_of(pid: int | None, metrics_url: str | None) -> UsageFn:
    def usage() -> stats.Usage | None:
        if pid is not None:
            return stats.proc_usage(pid)
        if metrics_url:
            with contextlib.suppress(OSError):
                return stats.scrape(metrics_url).usage
        return None

    return usage


def sample_of(pid: int | None, metrics_url: str | None) -> UsageFn:
    """`usage_of`, with the provider's mounts in flight from its /metrics when it is local
    (remote, `usage_of` reads them with the rest). Only the sampler asks for them, once per
    `--sample-every`: a scrape's CPU is noise against a phase's (measured: BENCHMARKS.md, "The
    bench's /metrics scrape"), and the phases' edges are read without one."""
    usage = usage_of(pid, metrics_url)
    if pid is None or not metrics_url:
        return usage
    url = metrics_url

    def sample() -> stats.Usage | None:
        found = usage()
        if found is not None:
            with contextlib.suppress(OSError):
                found = dataclasses.replace(found, in_flight=stats.scrape(url).in_flight)
        return found

    return sample


async def measure(
    socket: str,
    reqs: list[bytes],
    shape: load.Shape,
    args: argparse.Namespace,
    label: str,
    usage: UsageFn,
    during: Callable[[float], list[asyncio.Task[Any]]] | None = None,
) -> dict[str, Any]:
    """One phase against one server: clients, progress line, CPU and RSS at its edges."""
    clients = load.start_clients(socket, reqs, shape, max(1, args.clients))
    bar = _progress(label, shape, args.progress)
    collecting = asyncio.ensure_future(asyncio.to_thread(clients.collect))
    tasks: list[asyncio.Task[Any]] = []
    before = None
    try:
        while not collecting.done():
            now = time.monotonic()
            if before is None and now >= clients.begin:
                before = usage()
                tasks = during(clients.begin) if during else []
            if bar is not None:
                bar(clients, now - clients.begin)
            # Wake up at the measured phase's start, to read the CPU counters right then.
            wait = 0.25 if before is not None else min(0.25, clients.begin - now)
            await asyncio.wait([collecting], timeout=max(wait, 0.0))
        outcomes = collecting.result()
    finally:
        clients.stop()
        for task in tasks:
            task.cancel()
        if bar is not None:
            print(file=sys.stderr)
    after = usage()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    hist, outcome = load.merge(outcomes)
    return phase_summary(hist, outcome, before, after)


def _progress(label: str, shape: load.Shape, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm  # type: ignore[import-untyped]

    total = shape.mounts or shape.duration
    unit = "mount" if shape.mounts else "s"
    bar = tqdm(total=total, desc=f"{label:>8}", unit=unit, file=sys.stderr, leave=False)

    def update(clients: load.Clients, elapsed: float) -> None:
        _, measured = clients.done()
        bar.n = measured if shape.mounts else min(max(elapsed, 0.0), shape.duration)
        state = "warming up" if elapsed < 0 else f"{measured} mounts"
        bar.set_postfix_str(state, refresh=False)
        bar.refresh()

    return update


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    shape, pods = shape_of(args)
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        work = Path(tmp)
        target_cm = remote(args, pods) if args.socket else started(args, pods, work)
        async with target_cm as target:
            answer = None
            if not args.cold:
                answer = await probe(target.socket, target.requests[0], args.timeout)
            result: dict[str, Any] = {"echo": None}
            if not args.no_echo:
                async with floor(work, answer, args.floor_loop) as (socket, pid):
                    result["echo"] = await measure(
                        socket, target.requests, shape, args, "echo", usage_of(pid, None)
                    )
            result.update(await provider_phase(target, shape, args))
            if result["mount"]["errors"] and target.log is not None:
                lines = target.log.read_text(errors="replace").splitlines()
                result["provider_log_tail"] = lines[-3:]
            result["settings"] = settings_of(args, shape, pods, target)
            return result


async def provider_phase(
    target: Target, shape: load.Shape, args: argparse.Namespace
) -> dict[str, Any]:
    usage = usage_of(target.pid, target.metrics_url)
    sampled = sample_of(target.pid, target.metrics_url)
    samples: list[tuple[float, stats.Usage]] = []
    outages: list[tuple[float, float]] = []

    async def sample(begin: float) -> None:
        while True:
            if (u := await asyncio.to_thread(sampled)) is not None:
                samples.append((time.monotonic() - begin, u))
            await asyncio.sleep(args.sample_every)

    async def restart(begin: float) -> None:
        rigs = [r for r in target.rigs if hasattr(r, "restart")]
        while rigs:
            await asyncio.sleep(args.store_restart_every)
            down = time.monotonic() - begin
            await asyncio.gather(*(r.restart(args.store_down) for r in rigs))
            outages.append((down, time.monotonic() - begin))

    # The store calls of the measured window only: counted once it has begun (the probe mount
    # and the warm-up, often several times its calls, are behind) and after its last mount
    # answered; the rate divides them by the seconds from that first count to the last answer.
    before: dict[str, Any] = {}

    def during(begin: float) -> list[asyncio.Task[Any]]:
        before["scraped"] = _scrape(target.metrics_url)
        # The counts were rendered before this: a window from here is at most that much short,
        # so the rate errs high, if at all (the safe side for sizing a store's quota).
        before["at"] = time.monotonic()
        before["calls"] = _store_calls(target)
        before["begin"] = begin
        tasks = [asyncio.create_task(sample(begin))]
        if args.store_restart_every > 0:
            tasks.append(asyncio.create_task(restart(begin)))
        return tasks

    mount = await measure(target.socket, target.requests, shape, args, "mount", usage, during)
    scraped_after = _scrape(target.metrics_url)
    out: dict[str, Any] = {"mount": mount}
    out["store_calls"] = stats.delta(_store_calls(target), before.get("calls", {}))
    scraped_before = before.get("scraped")
    if scraped_before is not None and scraped_after is not None:
        calls = stats.delta(scraped_after.store_calls, scraped_before.store_calls)
        seconds = counted_seconds(before["begin"], before["at"], mount["seconds"])
        out["store_calls_per_s"] = {k: v / seconds for k, v in calls.items()}
    out["soak"] = soak_summary(samples, outages, mount, args.timeout)
    return out


def counted_seconds(begin: float, counted_at: float, measured: float) -> float:
    """The seconds the store-call counts cover: from the first count (a moment after the
    measured phase began at `begin`) to the phase's last answer, `measured` seconds after it."""
    window = begin + measured - counted_at
    return window if window > 0 else measured


def _store_calls(target: Target) -> dict[str, float]:
    calls: dict[str, float] = {}
    for rig in target.rigs:
        for name, n in rig.store_calls().items():
            calls[f"{rig.name} {name}"] = n
    return calls


def _scrape(url: str | None) -> stats.Scrape | None:
    if not url:
        return None
    try:
        return stats.scrape(url)
    except OSError:
        return None


def settings_of(
    args: argparse.Namespace, shape: load.Shape, pods: int, target: Target
) -> dict[str, Any]:
    return {
        "target": f"socket {args.socket}" if args.socket else f"store {args.store or 'fake'}",
        "classes": args.classes,
        "scenario": args.scenario,
        "shape": shape.mode,
        "concurrency": shape.concurrency if shape.mode == "closed" else None,
        "rate_per_s": shape.rate if shape.mode == "open" else None,
        "mounts": shape.mounts,
        "duration_s": shape.duration,
        "warmup_s": shape.warmup,
        "pods": pods,
        "clients": args.clients,
        "objects": None if args.socket else args.objects,
        "cache_ttl": None if args.socket else args.cache_ttl,
        "provider_args": args.provider_arg,
        "store_error_rate": args.store_error_rate,
        "store_restart_every": args.store_restart_every,
        "start_to_ready_s": target.ready_s,
    }
