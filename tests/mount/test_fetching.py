"""Single-flight, the value cache and identity isolation, counted at the fake store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from devkit.testing import Harness, make_pod
from provider.core.errors import MissingCredential, MountFailed

OBJECTS = [
    {"objectName": "a", "secretPath": "s"},
    {"objectName": "b", "secretPath": "s", "extract": "k"},
]


async def test_concurrent_mounts_share_one_read_with_cache_off(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"s": '{"k": "v"}'}})
    h.fake.latency = 0.2
    results = await asyncio.gather(*(h.mounter.mount(h.request(OBJECTS)) for _ in range(50)))
    assert all(len(r.files) == 2 for r in results)
    assert h.fake.reads == {"s": 1}  # 50 mounts x 2 objects of one ref -> one read
    # Cache off: a later mount reads again.
    await h.mounter.mount(h.request(OBJECTS))
    assert h.fake.reads == {"s": 2}


async def test_value_cache_serves_repeat_mounts_within_ttl(tmp_path: Path) -> None:
    h = Harness(tmp_path, cache_ttl=30)
    h.write({"secrets": {"s": '{"k": "v"}'}})
    for _ in range(5):
        await h.mounter.mount(h.request(OBJECTS))
    assert h.fake.reads == {"s": 1}


async def test_cache_is_keyed_by_identity(tmp_path: Path) -> None:
    h = Harness(tmp_path, cache_ttl=30)
    h.write({"secrets": {"s": "v"}, "access": {"s": ["default/app"]}})
    await h.mounter.mount(h.request(OBJECTS[:1]))
    for pod in (make_pod(service_account="other"), make_pod(namespace="evil")):
        with pytest.raises(MountFailed, match="may not read"):
            await h.mounter.mount(h.request(OBJECTS[:1], pod=pod))
    assert h.fake.reads == {"s": 3}


async def test_no_token_no_answer_even_when_cached(tmp_path: Path) -> None:
    h = Harness(tmp_path, cache_ttl=30)
    h.write({"secrets": {"s": "v"}})
    with_token = make_pod(tokens={"fake-aud": "jwt"})
    await h.mounter.mount(h.request(OBJECTS[:1], pod=with_token, audience="fake-aud"))
    with pytest.raises(MissingCredential, match="'fake-aud'"):
        await h.mounter.mount(h.request(OBJECTS[:1], audience="fake-aud"))
    assert h.fake.reads == {"s": 1}


async def test_errors_are_not_cached(tmp_path: Path) -> None:
    h = Harness(tmp_path, cache_ttl=30)
    h.write({"secrets": {}})
    with pytest.raises(MountFailed):
        await h.mounter.mount(h.request(OBJECTS[:1]))
    h.write({"secrets": {"s": "now-here"}})
    result = await h.mounter.mount(h.request(OBJECTS[:1]))
    assert result.files[0].contents == b"now-here"


async def test_mixed_failures_report_the_actionable_code(tmp_path: Path) -> None:
    from provider.core.errors import Status

    h = Harness(tmp_path)
    h.write({"secrets": {"ok": "v"}, "failures": {"down": "unavailable", "gone": "notfound"}})
    objects = [{"objectName": n, "secretPath": n} for n in ("ok", "down", "gone")]
    with pytest.raises(MountFailed) as info:
        await h.mounter.mount(h.request(objects))
    assert info.value.code == Status.NOT_FOUND
    assert "'down'" in str(info.value) and "'gone'" in str(info.value)
    assert "(fake, pod default/app-0 (service account app))" in str(info.value)


async def test_serve_stale_covers_a_store_outage_only(tmp_path: Path) -> None:
    from provider.core.errors import Status

    h = Harness(tmp_path, serve_stale_max_age=60)
    h.write({"secrets": {"s": "good"}})
    await h.mounter.mount(h.request(OBJECTS[:1]))
    h.write({"secrets": {"s": "good"}, "failures": {"s": "unavailable"}})
    result = await h.mounter.mount(h.request(OBJECTS[:1]))
    assert result.files[0].contents == b"good"
    assert h.metrics.cache_events.labels("stale", "served")._value.get() == 1
    # Another identity has no last good value of its own: the outage is reported.
    with pytest.raises(MountFailed) as info:
        await h.mounter.mount(h.request(OBJECTS[:1], pod=make_pod(service_account="b")))
    assert info.value.code == Status.UNAVAILABLE
    # A denial is never masked by an old value.
    h.write({"secrets": {"s": "good"}, "failures": {"s": "denied"}})
    with pytest.raises(MountFailed) as info:
        await h.mounter.mount(h.request(OBJECTS[:1]))
    assert info.value.code == Status.PERMISSION_DENIED


async def test_serve_stale_is_off_by_default(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"s": "good"}})
    await h.mounter.mount(h.request(OBJECTS[:1]))
    h.write({"secrets": {"s": "good"}, "failures": {"s": "unavailable"}})
    with pytest.raises(MountFailed, match="unavailable"):
        await h.mounter.mount(h.request(OBJECTS[:1]))


async def test_fetches_per_backend_are_bounded(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_concurrent_fetches=3)
    h.write({"secrets": {"s": "v"}})
    h.fake.latency = 0.05
    pods = [make_pod(service_account=f"sa{i}") for i in range(12)]
    await asyncio.gather(*(h.mounter.mount(h.request(OBJECTS[:1], pod=p)) for p in pods))
    assert h.fake.reads == {"s": 12}
    assert h.fake.peak_inflight == 3


async def test_a_caller_giving_up_does_not_cancel_the_shared_read(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"s": "v"}})
    h.fake.latency = 0.3
    impatient = asyncio.create_task(h.mounter.mount(h.request(OBJECTS[:1])))
    await asyncio.sleep(0.05)
    patient = asyncio.create_task(h.mounter.mount(h.request(OBJECTS[:1])))
    await asyncio.sleep(0.05)
    impatient.cancel()  # what the server's deadline does
    result = await patient
    assert result.files[0].contents == b"v"
    assert h.fake.reads == {"s": 1}
    assert impatient.cancelled()


async def test_the_store_call_is_cancelled_when_every_caller_gave_up(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"s": "v"}})
    h.fake.latency = 5
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await h.mounter.mount(h.request(OBJECTS[:1]))
    await asyncio.sleep(0.05)
    assert h.fake.inflight == 0 and h.fake.reads == {}
    # Nothing is left behind: the next mount starts a fresh read.
    h.fake.latency = 0
    assert (await h.mounter.mount(h.request(OBJECTS[:1]))).files[0].contents == b"v"


async def test_rate_limit_spreads_fetches(tmp_path: Path) -> None:
    import time

    h = Harness(tmp_path, rate_limits={"fake": 10})
    h.write({"secrets": {"s": "v"}})
    pods = [make_pod(service_account=f"sa{i}") for i in range(15)]
    start = time.monotonic()
    await asyncio.gather(*(h.mounter.mount(h.request(OBJECTS[:1], pod=p)) for p in pods))
    # A burst of 10 passes at once; the other 5 wait for tokens at 10 per second.
    assert time.monotonic() - start >= 0.4
    assert h.fake.reads == {"s": 15}


@pytest.mark.parametrize("flag", ["fake", "fake=0", "nosuch=5", "fake=x"])
def test_bad_rate_limit_flag(flag: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "provider.cli.main", "serve", "--rate-limit", flag],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--rate-limit" in result.stderr and "e.g. aws=40" in result.stderr


async def test_fetch_and_transform_failures_are_reported_together(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"s": '{"k": 1}'}, "failures": {"down": "unavailable"}})
    objects = [{"objectName": "down"}, {"objectName": "x", "secretPath": "s", "extract": "nope"}]
    with pytest.raises(MountFailed) as info:
        await h.mounter.mount(h.request(objects))
    assert [name for name, _ in info.value.failures] == ["down", "x"]


def _cache_events(h: Harness, event: str) -> float:
    value = h.metrics.registry.get_sample_value(
        "secrets_bridge_cache_events_total", {"cache": "values", "event": event}
    )
    return value or 0.0


async def test_a_fully_cached_mount_counts_one_hit_per_distinct_object_and_reads_nothing(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, cache_ttl=30)
    h.write({"secrets": {"s": '{"k": "v"}', "t": "w"}})
    objects = [*OBJECTS, {"objectName": "c", "secretPath": "t"}]  # refs s, s, t
    first = await h.mounter.mount(h.request(objects))
    assert (_cache_events(h, "miss"), _cache_events(h, "hit")) == (2, 0)
    again = await h.mounter.mount(h.request(objects))
    assert again is first  # the memoized answer of the very same cached values
    assert (_cache_events(h, "miss"), _cache_events(h, "hit")) == (2, 2)
    assert h.fake.reads == {"s": 1, "t": 1}


async def test_a_partly_cached_mount_reads_only_what_is_missing(tmp_path: Path) -> None:
    h = Harness(tmp_path, cache_ttl=30)
    h.write({"secrets": {"s": '{"k": "v"}', "t": "w"}})
    await h.mounter.mount(h.request(OBJECTS))
    result = await h.mounter.mount(h.request([*OBJECTS, {"objectName": "c", "secretPath": "t"}]))
    assert {f.path: f.contents for f in result.files} == {"a": b'{"k": "v"}', "b": b"v", "c": b"w"}
    assert h.fake.reads == {"s": 1, "t": 1}
    assert (_cache_events(h, "miss"), _cache_events(h, "hit")) == (2, 1)


async def test_an_expired_value_is_read_again(tmp_path: Path) -> None:
    h = Harness(tmp_path, cache_ttl=0.1)
    h.write({"secrets": {"s": '{"k": "v1"}'}})
    await h.mounter.mount(h.request(OBJECTS))
    h.write({"secrets": {"s": '{"k": "v2"}'}})
    await asyncio.sleep(0.2)
    result = await h.mounter.mount(h.request(OBJECTS))
    assert {f.path: f.contents for f in result.files}["b"] == b"v2"
    assert h.fake.reads == {"s": 2}


async def test_a_store_file_broken_after_start_is_one_line_naming_where(tmp_path: Path) -> None:
    # The same line `serve` gives at start (issue 41, defect 2), not the parser's type name.
    from provider.core.errors import Status, StoreUnavailable

    h = Harness(tmp_path)
    h.store_file.write_text("secrets:\n  a: [1\n")
    with pytest.raises(StoreUnavailable) as info:
        await h.mounter.mount(h.request(OBJECTS[:1]))
    assert info.value.code == Status.UNAVAILABLE
    message = str(info.value)
    assert f"--fake-store-file {h.store_file}: not valid YAML" in message, message
    assert "line 3" in message and "\n" not in message, message
