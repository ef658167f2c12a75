"""Numbers from one phase: latency percentiles (HDR histogram), errors by gRPC code, CPU per
call and RSS; for long runs, the provider's RSS and open files over time and where the errors
fell against the store's outages."""

from __future__ import annotations

import math
from typing import Any

from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

from provider.cli.bench.load import Outcome
from provider.cli.bench.stats import Usage

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
#: Timeline points kept in the JSON (and plotted): enough to see a stall, small enough to read.
TIMELINE_POINTS = 20_000


def _pct_key(q: float) -> str:
    return f"p{q:g}_ms".replace(".", "_")


def phase_summary(
    hist: HdrHistogram, outcome: Outcome, before: Usage | None, after: Usage | None
) -> dict[str, Any]:
    ok = int(hist.get_total_count())
    errors = sum(outcome.errors.values())
    calls = ok + errors
    seconds = outcome.seconds or 1e-9
    row: dict[str, Any] = {
        "ok": ok,
        "errors": errors,
        "errors_by_code": {
            code: {"count": n, "sample": outcome.samples.get(code, "")}
            for code, n in sorted(outcome.errors.items())
        },
        "seconds": seconds,
        "per_s": calls / seconds,
    }
    for q in PERCENTILES:
        row[_pct_key(q)] = hist.get_value_at_percentile(q) / 1000 if ok else 0.0
    row["max_ms"] = hist.get_max_value() / 1000 if ok else 0.0
    row["mean_ms"] = hist.get_mean_value() / 1000 if ok else 0.0
    if before is not None and after is not None and calls:
        cpu = after.cpu_seconds - before.cpu_seconds
        row["cpu_s"] = cpu
        row["cpu_us_per_call"] = cpu / calls * 1e6
        row["rss_mib"] = after.rss_mib
    step = max(1, len(outcome.times) // TIMELINE_POINTS)
    row["timeline"] = [
        (round(t, 4), round(lat * 1000, 3))
        for t, lat in zip(outcome.times[::step], outcome.latencies[::step], strict=True)
    ]
    row["error_times"] = [(round(t, 3), code) for t, code in outcome.error_times[:TIMELINE_POINTS]]
    return row


def soak_summary(
    samples: list[tuple[float, Usage]],
    outages: list[tuple[float, float]],
    mount: dict[str, Any],
    timeout: float,
) -> dict[str, Any]:
    """RSS, open files and threads over the run, their growth after the first minute (at the
    highest sample and, with outages, at the highest between them), and the errors that came
    back inside an outage (up to one mount deadline after it) and outside."""
    out: dict[str, Any] = {
        "samples": [
            {
                "t": round(t, 1),
                "rss_mib": round(u.rss_mib, 1),
                "fds": u.open_fds,
                "threads": u.threads,
                **({"in_flight": u.in_flight} if u.in_flight >= 0 else {}),
            }
            for t, u in samples
        ],
        "outages": [(round(a, 1), round(b, 1)) for a, b in outages],
    }

    def during(t: float) -> bool:  # an outage, or a mount deadline after it
        return any(a <= t <= b + timeout for a, b in outages)

    # The baseline is the first sample after the first minute, unless an outage has begun by
    # then (a kill may land at 60 s): then the last one before it. A sample taken in an outage
    # reads its dip in open files and its mounts in flight, not the steady state.
    first_outage = min((a for a, _ in outages), default=math.inf)
    before = [u for t, u in samples if t < first_outage]
    baseline = next((u for t, u in samples if 60 <= t < first_outage), None)
    if baseline is None and before:
        baseline = before[-1]
    settled = [(t, u) for t, u in samples if t >= 60]
    if len(settled) >= 2 and baseline is not None:
        highest = max(u.rss_mib for _, u in settled)
        out["rss_growth_after_1min"] = highest / baseline.rss_mib - 1
        if baseline.open_fds > 0:
            out["fds_growth_after_1min"] = (
                max(u.open_fds for _, u in settled) / baseline.open_fds - 1
            )
        # The highest sample counts the memory of the mounts an outage holds (working memory,
        # bounded by the mounts in flight) together with drift. Between outages, only what
        # stays: a leak grows there, outage after outage.
        between = [u.rss_mib for t, u in settled if not during(t)]
        if outages and between:
            out["rss_growth_between_outages"] = max(between) / baseline.rss_mib - 1
    # What an outage's step in RSS is made of: the mounts waiting while the store is down.
    in_flight = [(t, u.in_flight) for t, u in samples if u.in_flight >= 0]
    if in_flight:
        out["in_flight_max_during_outages"] = max((n for t, n in in_flight if during(t)), default=0)
        out["in_flight_max_outside"] = max((n for t, n in in_flight if not during(t)), default=0)
    if outages:
        inside = sum(1 for t, _ in mount["error_times"] if during(t))
        out["errors_during_outages"] = inside
        out["errors_outside_outages"] = len(mount["error_times"]) - inside
    return out
