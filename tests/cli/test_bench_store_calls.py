"""`bench`'s store calls are the measured phase's: the probe mount and the warm-up (here longer
than the measured phase, with as many calls per second) are not counted, and the rate divides
the calls by the seconds they were counted in — the figure operators size store quotas with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provider.cli.bench.command import counted_seconds
from provider.cli.main import main

OBJECTS = 3


def test_the_store_call_rate_is_the_measured_phases_by_the_fake_stores_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "result.json"
    code = main(
        [
            "bench", "--store", "fake", "--objects", str(OBJECTS), "--cache-ttl", "0",
            "--concurrency", "1", "--warmup", "1.5", "--duration", "1", "--no-echo",
            "--no-progress", "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    mount = result["mount"]
    mounts, seconds = mount["ok"] + mount["errors"], mount["seconds"]
    assert mount["errors"] == 0 and mounts > 100
    # No cache, and one mount at a time (concurrent mounts of one identity share their reads):
    # every measured mount reads each object once from the fake store.
    true_rate = OBJECTS * mounts / seconds
    (rate,) = result["store_calls_per_s"].values()
    assert rate == pytest.approx(true_rate, rel=0.1), (rate, true_rate)
    # The fake store's own count: the measured mounts' reads, less the few the count's first
    # scrape (a moment into the phase) missed; the warm-up's reads (more than the phase's)
    # and the probe mount's are not in it.
    (reads,) = result["store_calls"].values()
    assert 0.9 * OBJECTS * mounts <= reads <= OBJECTS * (mounts + 1), (reads, mounts)
    assert "store calls in the measured phase (counted by the store)" in capsys.readouterr().out


def test_the_counted_seconds_run_from_the_first_count_to_the_last_answer() -> None:
    # The phase began at 100.0 and its last mount answered 10 s later; counted from 100.5.
    assert counted_seconds(100.0, 100.5, 10.0) == pytest.approx(9.5)
    # A count taken after the phase's end (a phase shorter than a scrape) divides by the phase.
    assert counted_seconds(100.0, 111.0, 10.0) == 10.0
