"""What the servers spent: OS accounting of a local process (/proc), and the provider's
/metrics (its process collector reads the same /proc fields) when it runs elsewhere."""

from __future__ import annotations

import os
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Usage:
    """CPU seconds (user + system, all threads) and resident memory of a process."""

    cpu_seconds: float
    rss_mib: float
    open_fds: int = -1
    threads: int = -1
    #: Mounts the provider was serving (its secrets_bridge_mounts_in_flight); -1 if not read.
    in_flight: int = -1


def proc_usage(pid: int) -> Usage:
    """From /proc/<pid>: utime + stime (fields 14, 15 of stat), VmRSS, fds, threads."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        # The command name (field 2) may hold spaces; the fields after its ')' are fixed.
        rest = fh.read().rsplit(")", 1)[1].split()
    cpu = (int(rest[11]) + int(rest[12])) / _TICK
    rss, threads = 0.0, -1
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = -1
    return Usage(cpu, rss, fds, threads)


def rss_mib(pid: int) -> float:
    return proc_usage(pid).rss_mib


@dataclass(frozen=True)
class Scrape:
    """The parts of one /metrics page the bench uses."""

    usage: Usage | None
    #: secrets_bridge_backend_calls_total by "backend operation" ("+ outcome" unless ok).
    store_calls: dict[str, float]
    mounts: dict[str, float]  # secrets_bridge_mount_requests_total by "backend code"
    in_flight: int = -1  # secrets_bridge_mounts_in_flight


def scrape(url: str, timeout: float = 5.0) -> Scrape:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - an operator's URL
        text = resp.read().decode("utf-8", "replace")
    return parse_metrics(text)


def parse_metrics(text: str) -> Scrape:
    values: dict[str, float] = {}
    calls: dict[str, float] = {}
    mounts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            if name == "secrets_bridge_backend_calls_total":
                key = f"{labels.get('backend')} {labels.get('operation')}"
                if labels.get("outcome", "ok") != "ok":
                    key += f" ({labels['outcome']})"
                calls[key] = calls.get(key, 0.0) + sample.value
            elif name == "secrets_bridge_mount_requests_total":
                key = f"{labels.get('backend')} {labels.get('code')}"
                mounts[key] = mounts.get(key, 0.0) + sample.value
            elif name.startswith("process_") or name == "secrets_bridge_mounts_in_flight":
                values[name] = sample.value
    in_flight = int(values.get("secrets_bridge_mounts_in_flight", -1))
    usage = None
    if "process_cpu_seconds_total" in values:
        usage = Usage(
            values["process_cpu_seconds_total"],
            values.get("process_resident_memory_bytes", 0.0) / 2**20,
            int(values.get("process_open_fds", -1)),
            in_flight=in_flight,
        )
    return Scrape(usage, calls, mounts, in_flight)


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
