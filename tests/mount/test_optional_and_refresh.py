"""`optional: true` objects and a class's `refreshInterval`, through the mounter and the fake
store (reads counted at the store)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from devkit.testing import Harness, make_pod
from provider.core.errors import InvalidParameters, MountFailed, NotFound, PermissionDenied

WANTED = {"objectName": "wanted", "secretPath": "w"}
SPARE = {"objectName": "spare", "secretPath": "gone", "optional": "true"}


async def test_an_optional_object_not_found_leaves_its_file_out(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"w": "v"}})
    assert await h.files([WANTED, SPARE]) == {"wanted": b"v"}
    # Created later: the next poll writes it.
    h.write({"secrets": {"w": "v", "gone": "back"}})
    assert await h.files([WANTED, SPARE]) == {"wanted": b"v", "spare": b"back"}


async def test_without_optional_a_not_found_fails_the_mount(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"w": "v"}})
    with pytest.raises(MountFailed, match="'spare'") as info:
        await h.files([WANTED, {**SPARE, "optional": "false"}])
    assert isinstance(info.value.failures[0][1], NotFound)


async def test_a_denial_or_an_outage_is_never_optional(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"w": "v", "gone": "x"}, "access": {"gone": ["other/app"]}})
    with pytest.raises(MountFailed, match="may not read") as info:
        await h.files([WANTED, SPARE])
    assert isinstance(info.value.failures[0][1], PermissionDenied)
    h.write({"secrets": {"w": "v"}, "failures": {"gone": "unavailable"}})
    with pytest.raises(MountFailed, match="'spare'"):
        await h.files([WANTED, SPARE])


async def test_a_missing_optional_object_is_logged_once_per_class(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"w": "v"}})
    with caplog.at_level(logging.WARNING, logger="secrets_bridge.mounting"):
        for _ in range(5):
            await h.files([WANTED, SPARE])
    lines = [r for r in caplog.records if "optional objects not found" in r.getMessage()]
    assert len(lines) == 1
    fields = lines[0].fields  # type: ignore[attr-defined]
    assert fields["objects"] == ["spare (objects[1].objectName)"]
    assert fields["pod"] == "default/app"


async def test_the_audit_trail_records_an_absent_object(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"w": "v"}})
    result = await h.mounter.mount(h.request([WANTED, SPARE]), audit=True)
    sources = {s.name: s.source for s in result.served}
    assert sources == {"wanted": "store", "spare": "absent"}
    assert dict(result.object_versions).keys() == {"wanted"}


async def test_a_template_that_reads_a_missing_optional_object_fails_naming_it(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    h.write({"secrets": {"w": "v"}})
    templates = "- path: both\n  template: '${wanted}:${spare}'\n"
    with pytest.raises(NotFound, match=r"optional object 'spare', which the store does not"):
        await h.files([WANTED, SPARE], templates=templates)
    # A template that does not read it is built.
    only = "- path: one\n  template: '${wanted}!'\n"
    assert await h.files([WANTED, SPARE], templates=only) == {"wanted": b"v", "one": b"v!"}


async def test_every_object_optional_and_missing_is_refused(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    with pytest.raises(InvalidParameters, match="produced no files"):
        await h.files([SPARE])


async def test_optional_must_be_a_boolean(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    with pytest.raises(InvalidParameters, match=r"objects\[0\]\.optional: expected"):
        await h.files([{**SPARE, "optional": "maybe"}])


# refreshInterval


async def test_a_class_reuses_its_values_for_its_refresh_interval(tmp_path: Path) -> None:
    h = Harness(tmp_path, min_refresh_interval=0.0)  # --cache-ttl is off
    h.write({"secrets": {"w": "v1"}})
    slow = {"refreshInterval": "0.6s"}
    assert await h.files([WANTED], **slow) == {"wanted": b"v1"}
    h.write({"secrets": {"w": "v2"}})
    for _ in range(3):
        assert await h.files([WANTED], **slow) == {"wanted": b"v1"}
    assert h.fake.reads == {"w": 1}
    assert h.metrics.class_refresh_reuses._value.get() == 3
    # A class that says nothing reads at every poll (--cache-ttl 0), and does not disturb it.
    assert await h.files([WANTED]) == {"wanted": b"v2"}
    assert await h.files([WANTED], **slow) == {"wanted": b"v1"}
    await asyncio.sleep(0.7)
    h.write({"secrets": {"w": "v3"}})
    assert await h.files([WANTED], **slow) == {"wanted": b"v3"}
    assert h.fake.reads == {"w": 3}


async def test_a_missing_optional_object_is_not_read_again_within_the_window(
    tmp_path: Path,
) -> None:
    # Issue 41, defect 3: the present object came from the cache while the missing one was
    # read at every mount.
    h = Harness(tmp_path, cache_ttl=1.5, min_refresh_interval=0.0)
    h.write({"secrets": {"w": "v"}})
    for _ in range(5):
        assert await h.files([WANTED, SPARE]) == {"wanted": b"v"}
    assert h.fake.reads == {"w": 1, "gone": 1}
    # A class's refreshInterval holds a "not found" as long as a value.
    for _ in range(3):
        assert await h.files([WANTED, SPARE], refreshInterval="60s") == {"wanted": b"v"}
    assert h.fake.reads == {"w": 1, "gone": 1}
    # Created meanwhile: written once the window ends, and the "not found" is forgotten.
    h.write({"secrets": {"w": "v", "gone": "back"}})
    await asyncio.sleep(1.55)
    assert await h.files([WANTED, SPARE]) == {"wanted": b"v", "spare": b"back"}
    assert await h.files([WANTED, SPARE], refreshInterval="60s") == {
        "wanted": b"v",
        "spare": b"back",
    }
    assert h.fake.reads == {"w": 2, "gone": 2}


async def test_without_a_window_a_missing_object_is_read_at_every_mount(tmp_path: Path) -> None:
    h = Harness(tmp_path)  # --cache-ttl 0, no refreshInterval
    h.write({"secrets": {"w": "v"}})
    for _ in range(3):
        await h.files([WANTED, SPARE])
    assert h.fake.reads == {"w": 3, "gone": 3}


async def test_a_shorter_reuse_never_shortens_a_longer_one(tmp_path: Path) -> None:
    h = Harness(tmp_path, cache_ttl=0.3, min_refresh_interval=0.0)
    h.write({"secrets": {"w": "v1"}})
    await h.files([WANTED], refreshInterval="60s")
    await asyncio.sleep(0.35)
    await h.files([WANTED])  # --cache-ttl has passed: read again, and kept
    await asyncio.sleep(0.35)
    await h.files([WANTED], refreshInterval="60s")  # still within its minute
    assert h.fake.reads == {"w": 2}


async def test_refresh_interval_is_held_to_the_providers_bounds(tmp_path: Path) -> None:
    h = Harness(tmp_path, min_refresh_interval=30.0, max_refresh_interval=600.0)
    fast = h.mounter.plan(h.request([WANTED], refreshInterval="5s").params)
    assert fast.refresh == 30.0
    assert any("under this provider's floor of 30s" in w for w in fast.warnings)
    slow = h.mounter.plan(h.request([WANTED], refreshInterval="2h").params)
    assert slow.refresh == 600.0
    assert any("over this provider's ceiling of 600s" in w for w in slow.warnings)
    assert h.mounter.plan(h.request([WANTED], refreshInterval="1m30s").params).refresh == 90.0


async def test_refresh_interval_must_be_a_duration(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    with pytest.raises(InvalidParameters, match=r"refreshInterval: expected a duration"):
        await h.files([WANTED], refreshInterval="soon")


async def test_refresh_is_per_identity(tmp_path: Path) -> None:
    h = Harness(tmp_path, min_refresh_interval=0.0)
    h.write({"secrets": {"w": "v"}})
    for sa in ("a", "b", "a", "b"):
        result = await h.mounter.mount(
            h.request([WANTED], pod=make_pod(service_account=sa), refreshInterval="60s")
        )
        assert result.refresh == 60.0
    assert h.fake.reads == {"w": 2}
