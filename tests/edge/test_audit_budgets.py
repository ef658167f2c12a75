"""Issue 32, attack 3: the audit trail as a denial lever. A namespace whose mounts are refused
over and over, with a class near the size limits, wrote every object reference and the whole
message on every refusal (~500 KB a refused mount); a trail whose disk fills fails every
namespace's mounts. Now a refusal is summarized, a pod's repeated refusals are counted, each
namespace has a budget of refusal lines, and every answer is still recorded."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from backends.fake.options import Options as FakeOptions
from devkit.serving import serving
from devkit.testing import driver_request, make_pod
from protos import provider_pb2_grpc
from provider.cli.main import main
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings
from provider.edge import audit, auditchain
from provider.edge.audit import AuditTrail, FileSink
from provider.mount.auditing import Served, class_digest
from provider.mount.mounting import MountInput, MountResult

#: A class near the limits: --max-objects objects, each a 2,500-character path the store does
#: not hold (about 250 KiB of YAML; a parameter may have 256 KiB).
HUGE = {
    "backend": "fake",
    "objects": yaml.safe_dump(
        [{"objectName": f"o{i}", "secretPath": f"{i}-" + "p" * 2480} for i in range(100)],
        width=1 << 20,
    ),
}
GOOD = {"backend": "fake", "objects": "- {objectName: k, secretPath: api-key}"}
#: The most one line of the trail may take (a refusal's summary is about 3.4 KiB at most).
LINE_BYTES = 4096


def request(params: dict[str, str], pod: str, namespace: str) -> Any:
    r = driver_request(params, namespace=namespace, pod=pod, spc="huge")
    r.target_path = f"/var/lib/kubelet/pods/uid-{pod}/volumes/kubernetes.io~csi/s/mount"
    return r


class Rig:
    def __init__(self, stub: Any, trail: Path) -> None:
        self.stub, self.trail = stub, trail
        self.refusals = 0
        self.victim_mounts = 0

    async def attack(self, pod: str) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await self.stub.Mount(request(HUGE, pod, "tenant-b"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        self.refusals += 1

    async def victim(self, pod: str) -> None:
        reply = await self.stub.Mount(request(GOOD, pod, "tenant-a"), timeout=10)
        assert [f.contents for f in reply.files] == [b"k-1"]
        self.victim_mounts += 1

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.trail.read_text().splitlines()]


@contextlib.asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[Rig]:
    """A provider with its trail in a file; the trail is intact once it stopped."""
    store = tmp_path / "store.yaml"
    store.write_text(yaml.safe_dump({"secrets": {"api-key": "k-1"}}))
    trail = tmp_path / "audit.log"
    async with serving(
        tmp_path,
        backend_options={"fake": FakeOptions(store_file=str(store))},
        core=CoreSettings(enable_fake_backend=True),
        audit_log=str(trail),
    ) as running:
        # The driver's own limit on a trailer (grpc-go's default, 16 MiB), not C-core's 8 KiB:
        # this test is about the trail, whatever the error's size.
        channel = grpc.aio.insecure_channel(
            f"unix://{running.socket}",
            options=[
                ("grpc.default_authority", "localhost"),
                ("grpc.max_metadata_size", 16 << 20),
                ("grpc.absolute_max_metadata_size", 16 << 20),
            ],
        )
        try:
            yield Rig(provider_pb2_grpc.CSIDriverProviderStub(channel), trail)
        finally:
            await channel.close()
    key = tmp_path / "hmac.key"
    assert main(["audit", "verify", str(trail), "--hmac-key-file", str(key)]) == 0


# Timed: the namespace's budget refills 30 a minute while the attack runs (0.8 s alone), so it
# runs alone after the parallel run (Makefile, `make test`): under the parallel run's load the
# attack once took long enough to refill 4 of the 9 refusals it counts on being dropped.
@pytest.mark.serial
async def test_refusals_of_a_huge_class_cannot_fill_the_trail(tmp_path: Path) -> None:
    async with served(tmp_path) as rig:
        await rig.victim("victim-0")
        size = rig.trail.stat().st_size
        await rig.attack("attacker-0")
        first = rig.trail.stat().st_size - size
        # The kubelet's retries of one pod, with the victim's pods mounting in between.
        for i in range(20):
            await rig.attack("attacker-0")
            if i % 5 == 0:
                await rig.victim(f"victim-{i + 1}")
        # Many pods of the attacking namespace, each refused once: past its budget.
        for i in range(audit.REFUSAL_RECORDS + 10):
            await rig.attack(f"attacker-{i + 1}")
        await rig.victim("victim-late")  # right after the attack
        # Its next record, an answer (always written), carries the count of those not written.
        await rig.stub.Mount(request(GOOD, "attacker-0", "tenant-b"), timeout=10)
        attacked = rig.trail.stat().st_size - size
    print(
        f"\ntrail: {first} bytes for a pod's first refusal of a {len(HUGE['objects'])}-byte "
        f"class; {attacked} bytes for {rig.refusals} refusals "
        f"({attacked / rig.refusals:.0f} B/refused mount)"
    )
    lines = rig.lines()
    assert first < LINE_BYTES  # was ~500 KB: every reference and the whole message
    assert all(len(json.dumps(line)) < LINE_BYTES for line in lines)
    refused = [r for r in lines if r.get("event") == "refused"]
    mine = [r for r in refused if r["pod"] == "attacker-0"]
    assert len(mine) == 1  # its 20 retries were counted, not written
    summary = mine[0]
    assert summary["object_count"] == 100 and len(summary["objects"]) == audit.REFUSED_OBJECTS
    assert summary["class_digest"] == class_digest(HUGE | {"secretProviderClass": "huge"})
    for entry in summary["objects"]:
        assert len(json.dumps(entry["ref"])) - 2 <= audit.REF_BYTES and entry["ref_sha256"]
    assert len(summary["message"]) <= audit.MESSAGE_BYTES
    assert len(refused) <= audit.REFUSAL_RECORDS + 1  # the namespace's budget (and a refill)
    [answer] = [r for r in lines if r.get("event") == "answered" and r["pod"] == "attacker-0"]
    assert answer["dropped"] >= 9 and "repeats" not in answer  # another class: not its count
    # The huge class's count, which no record of that pod and class carried, at shutdown.
    [repeated] = [r for r in lines if r.get("event") == "repeated"]
    assert (repeated["pod"], repeated["code"], repeated["repeats"]) == (
        "attacker-0",
        "NOT_FOUND",
        20,
    )
    # Every refusal is on record: written, or counted on a record that was.
    counted = sum(r.get("repeats", 0) + r.get("dropped", 0) for r in lines)
    assert len(refused) + counted == rig.refusals
    # The victim's mounts were served and each is on record.
    victims = [r for r in lines if r.get("namespace") == "tenant-a"]
    assert [r["event"] for r in victims] == ["answered"] * rig.victim_mounts == ["answered"] * 6


# The trail's counts over time, with a clock of our own.


class Clock:
    def __init__(self) -> None:
        self.now = 1_790_000_000.0

    def __call__(self) -> float:
        return self.now


def mount_input(pod: str = "p0", namespace: str = "tenant-b") -> MountInput:
    return MountInput(
        params={"backend": "fake", "secretProviderClass": "c", "objects": "- o"},
        pod=make_pod(namespace=namespace, name=pod, uid=f"uid-{pod}"),
        permission=0o644,
    )


ANSWER = MountResult(files=(), versions=(), backend="fake", served=(Served("o", "fake", "o"),))


class Failing(FileSink):
    full = False

    def _write_all(self, data: bytes) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        super()._write_all(data)


def trail_at(path: Path, clock: Clock) -> AuditTrail:
    trail = AuditTrail(
        Failing(str(path)),
        auditchain.derive_key(b"k" * 32),
        metrics=Metrics(),
        requested=lambda params: (Served("o", "fake", "o"),),
        clock=clock,
    )
    trail.start()
    return trail


def records(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "mac")} for r in lines[1:]]


def test_a_pods_repeated_refusal_is_written_again_after_the_interval(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "a.log"
    trail = trail_at(path, clock)
    for _ in range(5):
        assert trail.refused(mount_input(), "NOT_FOUND", "gone")
        clock.now += 60
    clock.now += audit.REPEATS_EVERY
    trail.refused(mount_input(), "NOT_FOUND", "gone")  # written again, with the count
    trail.refused(mount_input(), "PERMISSION_DENIED", "no")  # another outcome: written
    trail.refused(mount_input(), "PERMISSION_DENIED", "no")
    assert trail.answered(mount_input(), ANSWER)  # always written, with the count
    trail.close()
    got = [(r["event"], r.get("code"), r.get("repeats")) for r in records(path)]
    assert got == [
        ("refused", "NOT_FOUND", None),
        ("refused", "NOT_FOUND", 4),
        ("refused", "PERMISSION_DENIED", None),
        ("answered", "OK", 1),
    ]


def test_counts_no_record_carried_are_written_on_their_own(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "a.log"
    trail = trail_at(path, clock)
    for pod in ("gone", "stays"):
        for _ in range(3):
            trail.refused(mount_input(pod), "NOT_FOUND", "gone")
    clock.now += audit.REPEATS_EVERY  # the pod "gone" stopped retrying
    trail.answered(mount_input("other", "tenant-a"), ANSWER)
    trail.close()  # at shutdown: every count still pending
    got = [(r["event"], r.get("pod"), r.get("repeats")) for r in records(path)]
    assert got == [
        ("refused", "gone", None),
        ("refused", "stays", None),
        ("answered", "other", None),
        ("repeated", "gone", 2),
        ("repeated", "stays", 2),
    ]
    assert main(["audit", "verify", str(path), "--hmac-key-file", str(key(tmp_path))]) == 0


def key(tmp_path: Path) -> Path:
    path = tmp_path / "k"
    path.write_bytes(b"k" * 32)
    return path


def test_a_namespace_over_its_budget_is_counted_and_others_are_not(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "a.log"
    trail = trail_at(path, clock)
    over = audit.REFUSAL_RECORDS + 5
    for i in range(over):
        assert trail.refused(mount_input(f"b-{i}"), "NOT_FOUND", "gone")
    assert trail.refused(mount_input("a-0", "tenant-a"), "NOT_FOUND", "gone")
    clock.now += audit.REFUSAL_WINDOW / audit.REFUSAL_RECORDS  # one refilled
    trail.refused(mount_input("b-late"), "NOT_FOUND", "gone")
    for i in range(3):
        trail.refused(mount_input(f"b-more-{i}"), "NOT_FOUND", "gone")
    clock.now += audit.REFUSAL_WINDOW
    trail.answered(mount_input("a-1", "tenant-a"), ANSWER)  # the sweep writes b's count
    trail.close()
    got = records(path)
    b = [r for r in got if r.get("namespace") == "tenant-b"]
    assert len([r for r in b if r["event"] == "refused"]) == audit.REFUSAL_RECORDS + 1
    assert b[audit.REFUSAL_RECORDS]["pod"] == "b-late" and b[audit.REFUSAL_RECORDS]["dropped"] == 5
    assert (b[-1]["event"], b[-1]["dropped"]) == ("dropped", 3)
    a = [(r["event"], r["pod"]) for r in got if r.get("namespace") == "tenant-a"]
    assert a == [("refused", "a-0"), ("answered", "a-1")]


def test_a_real_sink_failure_still_fails_closed(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "a.log"
    trail = trail_at(path, clock)
    for i in range(audit.REFUSAL_RECORDS + 5):  # the namespace's budget spent
        trail.refused(mount_input(f"b-{i}"), "NOT_FOUND", "gone")
    sink = trail._sink
    assert isinstance(sink, Failing)
    sink.full = True
    # Budgets never hide a failing sink: an answer that cannot be written is not sent.
    assert not trail.answered(mount_input("a-0", "tenant-a"), ANSWER)
    assert not trail.answered(mount_input("b-0"), ANSWER)
    assert not trail.refused(mount_input("a-1", "tenant-a"), "NOT_FOUND", "gone")
    sink.full = False
    assert trail.answered(mount_input("b-0"), ANSWER)
    trail.close()
    # The count the failed answer could not carry is on the next one.
    assert records(path)[-1]["dropped"] == 5
    os.remove(path)


def test_a_refusal_line_is_bounded_whatever_the_class(tmp_path: Path) -> None:
    """Every tenant-chosen field at its worst: long, non-ASCII (six bytes a character as JSON
    writes it), a store per object."""
    worst = "\u00e9\u2028\U0001d11e" * 2000
    served = tuple(Served(worst, f"{i}{worst}", f"{i}{worst}") for i in range(100))
    path = tmp_path / "a.log"
    trail = AuditTrail(
        FileSink(str(path)),
        auditchain.derive_key(b"k" * 32),
        metrics=Metrics(),
        requested=lambda params: served,
    )
    trail.start()
    pod = make_pod(namespace="n" * 63, name="p" * 253, uid="u" * 36, service_account="s" * 253)
    params = {"secretProviderClass": worst, "backend": worst, "objects": worst}
    assert trail.refused(MountInput(params, pod, 0o644), "INVALID_ARGUMENT", worst * 2)
    result = MountResult(files=(), versions=(), backend="fake", served=served)
    assert trail.answered(MountInput(params, pod, 0o644), result)
    trail.close()
    refused, *answered = path.read_text().splitlines()[1:]
    assert len(refused) <= 8192
    # An answer names every object (its references cut, each with the digest of the whole),
    # over as many chained lines as it takes, each within the line bound.
    parts = [json.loads(line) for line in answered]
    assert [p["event"] for p in parts] == ["answered"] + ["continued"] * (len(parts) - 1)
    assert all(p["parts"] == len(parts) and p["pod"] == "p" * 253 for p in parts)
    assert all(len(line) + 1 <= audit.LINE_BYTES for line in answered)
    entries = [e for p in parts for e in p["objects"]]
    assert len(entries) == 100 and all(len(e["ref_sha256"]) == 64 for e in entries)
    assert sum(map(len, answered)) < 100 * 3 * (audit.REF_BYTES + 100)
