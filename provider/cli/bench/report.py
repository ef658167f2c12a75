"""The bench's outputs: the text report, the JSON file, the plot."""

from __future__ import annotations

from typing import Any

from provider.cli.bench.summary import PERCENTILES, _pct_key


def _head(s: dict[str, Any]) -> str:
    load = (
        f"open loop {s['rate_per_s']:g}/s"
        if s["shape"] == "open"
        else f"closed loop, concurrency {s['concurrency']}"
    )
    amount = f"{s['mounts']} mounts" if s["mounts"] else f"{s['duration_s']:g} s"
    extra = "" if s["cache_ttl"] is None else f", cache-ttl {s['cache_ttl']:g}"
    objects = "" if s["objects"] is None else f", {s['objects']} objects"
    return (
        f"{s['target']}, scenario {s['scenario']}: {load}, {amount} after "
        f"{s['warmup_s']:g} s warm-up, {s['pods']} pods{objects}{extra}, "
        f"{s['clients']} client process(es)"
    )


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [_head(s)]
    cols = [_pct_key(q) for q in PERCENTILES] + ["max_ms"]
    names = [f"p{q:g}" for q in PERCENTILES] + ["max"]
    lines.append(
        f"{'':7}" + "".join(f"{n + ' ms':>10}" for n in names)
        + f"{'mounts/s':>10}{'errors':>8}{'CPU µs/call':>13}{'RSS MiB':>9}"
    )  # fmt: skip
    rows = [("echo", result["echo"]), ("mount", result["mount"])]
    for label, row in rows:
        if row is None:
            continue
        cpu = f"{row['cpu_us_per_call']:.0f}" if "cpu_us_per_call" in row else "-"
        rss = f"{row['rss_mib']:.0f}" if "rss_mib" in row else "-"
        lines.append(
            f"{label:7}" + "".join(f"{row[c]:>10.2f}" for c in cols)
            + f"{row['per_s']:>10.0f}{row['errors']:>8}{cpu:>13}{rss:>9}"
        )  # fmt: skip
    echo, mount = result["echo"], result["mount"]
    if echo and echo["ok"] and mount["ok"]:
        ratio = f"p50 {mount['p50_ms'] / echo['p50_ms']:.2f}x"
        if echo.get("cpu_us_per_call") and "cpu_us_per_call" in mount:
            ratio += (
                f", server CPU per call {mount['cpu_us_per_call'] / echo['cpu_us_per_call']:.2f}x"
            )
        lines.append(f"mount vs echo: {ratio} (same requests, same load, one after the other)")
        if min(echo.get("cpu_s", 1.0), mount.get("cpu_s", 1.0)) < 1.0:
            lines.append(
                "  (under 1 s of server CPU in a phase: CPU is counted in 10 ms ticks, so the "
                "CPU figures are coarse; run longer for them)"
            )
    for code, err in mount["errors_by_code"].items():
        lines.append(f"errors {code}: {err['count']}, e.g. {err['sample']!r}")
    if result.get("store_calls"):
        calls = ", ".join(f"{k} {v:g}" for k, v in result["store_calls"].items())
        lines.append(f"store calls in the measured phase (counted by the store): {calls}")
    if "store_calls_per_s" in result:
        per_s = result["store_calls_per_s"]
        text = ", ".join(f"{k} {v:.1f}/s" for k, v in sorted(per_s.items())) or "none"
        lines.append(f"store calls per second (provider /metrics): {text}")
    lines += soak_lines(result["soak"], s)
    if s.get("start_to_ready_s") is not None:
        lines.append(f"provider: start to ready {s['start_to_ready_s']:.2f} s")
    lines.extend("  " + line[:300] for line in result.get("provider_log_tail", []))
    return "\n".join(lines)


def soak_lines(soak: dict[str, Any], s: dict[str, Any]) -> list[str]:
    """The soak's lines of the report: RSS and open files over the run, their growth, the
    mounts in flight and where the errors fell against the outages."""
    lines = []
    samples = soak["samples"]
    if len(samples) >= 2:
        rss = [x["rss_mib"] for x in samples]
        fds = [x["fds"] for x in samples]
        lines.append(
            f"provider over the run: RSS {rss[0]:.0f} -> {rss[-1]:.0f} MiB (max {max(rss):.0f}), "
            f"open files {fds[0]} -> {fds[-1]} (max {max(fds)})"
            + (f", threads {samples[-1]['threads']}" if samples[-1]["threads"] >= 0 else "")
        )
    if "rss_growth_after_1min" in soak:
        fd = soak.get("fds_growth_after_1min")
        between = soak.get("rss_growth_between_outages")
        text = f"growth after the first minute: RSS {soak['rss_growth_after_1min']:+.1%}"
        if between is not None:
            # The highest sample may hold an outage's waiting mounts; between them is drift.
            text += f" at the highest, {between:+.1%} between outages"
        lines.append(text + (f", open files {fd:+.1%}" if fd is not None else ""))
    if "in_flight_max_outside" in soak:
        during = soak["in_flight_max_during_outages"]
        where = f"{during} during outages, {soak['in_flight_max_outside']} outside"
        if not soak["outages"]:
            where = str(soak["in_flight_max_outside"])
        lines.append(f"mounts in flight (the provider's gauge, at each sample): at most {where}")
    if soak["outages"]:
        spans = ", ".join(f"{a:g}-{b:g} s" for a, b in soak["outages"])
        lines.append(
            f"store outages at {spans}: errors during them (or within one mount deadline "
            f"after) {soak['errors_during_outages']}, outside {soak['errors_outside_outages']}"
        )
    return lines


def plot(path: str, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (over_time, dist) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label in ("echo", "mount"):
        row = result[label]
        if not row or not row["timeline"]:
            continue
        t, ms = zip(*row["timeline"], strict=True)
        over_time.plot(t, ms, ".", markersize=2, alpha=0.5, label=label)
        ordered = sorted(ms)
        n = len(ordered)
        dist.plot([100 * (i + 1) / n for i in range(n)], ordered, label=label)
        for start, end in result["soak"]["outages"] if label == "mount" else []:
            over_time.axvspan(start, end, color="red", alpha=0.15)
    over_time.set_xlabel("seconds into the run (scheduled send time)")
    over_time.set_ylabel("latency (ms)")
    over_time.set_yscale("log")
    over_time.legend()
    dist.set_xlabel("percentile")
    dist.set_ylabel("latency (ms)")
    dist.set_yscale("log")
    dist.legend()
    fig.suptitle(_head(result["settings"]), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
