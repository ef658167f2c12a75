"""Issue 32, attack 4: log amplification. A refused class's whole message (hundreds of KB) was
logged on every retry and returned to the driver (gRPC clients with C-core's trailer limits
failed on it), and every new class's warnings were logged whole: log volume was a multiple of
the class size per retry. Now the error is bounded, a volume's repeated failures are grouped,
every line is capped and each namespace's lines have a budget, with a count of what was
dropped."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import yaml

from devkit.serving import Provider
from devkit.testing import driver_request
from provider.core.budgets import Budgets
from provider.core.errors import (
    MAX_MESSAGE_BYTES,
    InvalidParameters,
    MountFailed,
    NotFound,
    cut,
    wire_bytes,
)
from provider.edge import logs
from provider.edge.logs import (
    DROPPED_TEXT,
    LINE_BYTES,
    BoundedHandler,
    JsonFormatter,
    TextFormatter,
)

HUGE = {
    "backend": "fake",
    "objects": yaml.safe_dump(
        [{"objectName": f"o{i}", "secretPath": f"{i}-" + "p" * 2480} for i in range(100)],
        width=1 << 20,
    ),
}
GOOD = {"backend": "fake", "objects": "- {objectName: k, secretPath: api-key}"}


def warned(tag: int) -> dict[str, str]:
    """A new class that mounts, with 50 unknown keys: 50 warnings (~12 KB) on its first mount."""
    keys = {f"c{tag}UnknownKey{j:02d}" + "u" * 200: 1 for j in range(50)}
    objects = [{"objectName": "k", "secretPath": "api-key", **keys}]
    return {"backend": "fake", "objects": yaml.safe_dump(objects, width=1 << 20)}


def request(params: dict[str, str], pod: str, namespace: str) -> Any:
    r = driver_request(params, namespace=namespace, pod=pod, spc="huge")
    r.target_path = f"/var/lib/kubelet/pods/uid-{pod}/volumes/kubernetes.io~csi/s/mount"
    return r


@pytest.fixture
def logged() -> Iterator[tuple[io.StringIO, BoundedHandler]]:
    """The provider's own handler (as `serve` installs it) on a buffer, beside pytest's."""
    buffer = io.StringIO()
    handler = BoundedHandler(buffer, Budgets(burst=48 * 1024, rate=0.0))
    handler.setFormatter(JsonFormatter())
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield buffer, handler
    finally:
        root.removeHandler(handler)


def lines_of(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


async def test_a_refused_huge_class_is_bounded_to_the_driver_and_in_the_log(
    provider: Provider, logged: tuple[io.StringIO, BoundedHandler]
) -> None:
    buffer, _ = logged
    provider.write_store({"secrets": {"api-key": "k-1"}})
    victim = await provider.stub.Mount(request(GOOD, "victim-0", "tenant-a"), timeout=10)
    assert victim.files[0].contents == b"k-1"
    before = len(buffer.getvalue())
    # The driver's dial options: C-core clients refuse a trailer over 8 KiB (16 KiB always).
    details = []
    for _ in range(20):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await provider.stub.Mount(request(HUGE, "attacker-0", "tenant-b"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND  # not the trailer's failure
        details.append(refused.value.details())
    logged_bytes = len(buffer.getvalue()) - before
    print(
        f"\nerror to the driver: {wire_bytes(details[0])} bytes on the wire; "
        f"log: {logged_bytes} bytes for 20 refusals of one volume "
        f"({logged_bytes / 20:.0f} B/refused mount)"
    )
    message = details[0]
    assert wire_bytes(message) <= MAX_MESSAGE_BYTES
    assert message.startswith("100 objects failed: object 'o0': fake store: no secret at '0-ppp")
    assert message.endswith(
        "; and 97 more objects (fake, pod tenant-b/attacker-0 (service account app))"
    )
    # One line for the volume's 20 identical failures (the rest counted), itself bounded.
    failed = [line for line in lines_of(buffer) if line["msg"] == "mount failed"]
    assert len(failed) == 1 and failed[0]["error"] == message
    assert logged_bytes < 2 * MAX_MESSAGE_BYTES  # was 20 x 253 KB
    # A new failure of that volume is logged at once, with the count of the old one.
    provider.write_store({"secrets": {"api-key": "k-1"}, "failures": {"0-" + "p" * 2480: "denied"}})
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await provider.stub.Mount(request(HUGE, "attacker-0", "tenant-b"), timeout=10)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    failed = [line for line in lines_of(buffer) if line["msg"] == "mount failed"]
    assert [(f["code"], f.get("repeats")) for f in failed] == [
        ("NOT_FOUND", None),
        ("PERMISSION_DENIED", 19),
    ]
    victim = await provider.stub.Mount(request(GOOD, "victim-1", "tenant-a"), timeout=10)
    assert victim.files[0].contents == b"k-1"
    mounts = [line["pod"] for line in lines_of(buffer) if line["msg"] == "mount"]
    assert mounts == ["victim-0", "victim-1"]


async def test_a_namespaces_log_lines_have_a_budget_and_others_are_logged(
    provider: Provider, logged: tuple[io.StringIO, BoundedHandler]
) -> None:
    buffer, handler = logged
    provider.write_store({"secrets": {"api-key": "k-1"}})
    # New classes with many warnings each, and refused huge classes, from one namespace; the
    # victim's pods mount in between.
    for i in range(24):
        await provider.stub.Mount(request(warned(i), f"b-{i}", "tenant-b"), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError):
            await provider.stub.Mount(request(HUGE, f"b-huge-{i}", "tenant-b"), timeout=10)
        if i % 6 == 0:
            reply = await provider.stub.Mount(request(GOOD, f"a-{i}", "tenant-a"), timeout=10)
            assert reply.files[0].contents == b"k-1"
    reply = await provider.stub.Mount(request(GOOD, "a-late", "tenant-a"), timeout=10)
    assert reply.files[0].contents == b"k-1"
    handler.close()  # writes the counts not written yet
    lines = buffer.getvalue().splitlines()
    assert all(len(line) <= LINE_BYTES for line in lines)
    entries = [json.loads(line) for line in lines]
    warnings = [e for e in entries if e["msg"] == "class parameters need attention"]
    # Each new class's warnings once (mounting.py), cut: 50 warnings are ~12 KB.
    assert warnings and all(e["truncated"] and len(e["warnings"]) < 50 for e in warnings)
    b_bytes = sum(len(line) + 1 for line, e in zip(lines, entries, strict=True) if _b(e))
    assert b_bytes <= 48 * 1024  # its budget (no refill in this test)
    # What was dropped is counted, on lines of their own before its next line that passed.
    dropped = [e for e in entries if e["msg"] == DROPPED_TEXT]
    assert {e["namespace"] for e in dropped} == {"tenant-b"}
    assert sum(e["dropped"] for e in dropped) > 10
    # The victim's lines were all written.
    assert [e["pod"] for e in entries if e["msg"] == "mount" and e["namespace"] == "tenant-a"] == [
        "a-0",
        "a-6",
        "a-12",
        "a-18",
        "a-late",
    ]


def _b(entry: dict[str, Any]) -> bool:
    return entry.get("namespace") == "tenant-b" and entry["msg"] != DROPPED_TEXT


# The error text, the line caps and the budgets on their own.


def test_the_error_keeps_its_first_problems_and_counts_the_rest() -> None:
    problems = [
        f"objects[{i}].filePermission: expected a file mode, got 'ñ{'9' * 300}'" for i in range(400)
    ]
    text = InvalidParameters(problems).brief()
    assert wire_bytes(text) <= MAX_MESSAGE_BYTES
    assert text.startswith("400 problems: objects[0].filePermission")
    kept = text.count("filePermission")
    assert text.endswith(f"; and {400 - kept} more problems") and kept >= 5
    # Short lists are unchanged.
    assert InvalidParameters(["a", "b"]).brief() == "2 problems: a; b"
    assert MountFailed([("x", NotFound("gone"))], "fake").brief() == "object 'x': gone (fake)"


@pytest.mark.parametrize("char", ["é", "€", "𝄞", "%", "\n"])
def test_the_error_is_never_cut_inside_a_character(char: str) -> None:
    text = NotFound("no secret at " + char * 10_000).brief()
    assert wire_bytes(text) <= MAX_MESSAGE_BYTES < wire_bytes(text + char * 4)
    assert text.endswith(char + "…")
    text.encode("utf-8")  # whole characters only
    assert cut("é" * 10, 6 * 4 + 9) == "éééé…"  # é is %C3%A9 on the wire


def test_a_line_is_capped_whatever_its_fields() -> None:
    record = logging.LogRecord(
        "secrets_bridge.x", logging.WARNING, "", 0, "m\u2028" * 9000, (), None
    )
    record.fields = {
        "namespace": "ns",
        "error": "\x00é" * 100_000,
        "warnings": [f"w{i} " + "x" * 100 for i in range(10_000)],
        "versions": {f"o{i}": "v" * 64 for i in range(5_000)},
        "n": 3,
    }
    line = JsonFormatter().format(record)
    entry = json.loads(line)
    assert len(line) <= LINE_BYTES and entry["truncated"] is True
    assert (entry["namespace"], entry["n"]) == ("ns", 3)
    assert entry["warnings"][0].startswith("w0 ") and entry["warnings"][-1].endswith(" more")
    text = TextFormatter().format(record)
    assert len(text.encode()) <= LINE_BYTES and "\n" not in text and "truncated=true" in text
    try:
        raise ValueError("x" * 100_000)
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert len(JsonFormatter().format(record)) <= LINE_BYTES
    assert len(TextFormatter().format(record).encode()) <= LINE_BYTES


def test_budgets_refill_and_report_what_they_dropped() -> None:
    now = [1000.0]
    buffer = io.StringIO()
    handler = BoundedHandler(buffer, Budgets(burst=1000, rate=100.0), clock=lambda: now[0])
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("secrets_bridge.test_budgets")
    log.propagate = False
    log.addHandler(handler)
    try:
        for _ in range(20):
            log.warning("x" * 200, extra={"fields": {"namespace": "b"}})
        log.warning("provider's own line")  # no namespace: never dropped
        token = logs.TENANT.set(lambda: "b")  # a line on one of b's mounts
        log.warning("during b's mount")
        logs.TENANT.reset(token)
        now[0] += 5.0  # 500 bytes refilled
        log.warning("later", extra={"fields": {"namespace": "b"}})
    finally:
        log.removeHandler(handler)
    entries = lines_of(buffer)
    msgs = [(e["msg"][:5], e.get("dropped")) for e in entries]
    passed = msgs.count(("xxxxx", None))
    assert 1 <= passed < 5  # ~300 bytes a line: a few fit in 1,000
    assert msgs[passed:] == [
        ("provi", None),
        # Reported before b's next line that passes: the rest of the 20, and the line logged
        # during b's mount.
        ("log l", 20 - passed + 1),
        ("later", None),
    ]


def test_serve_quiets_every_registered_stores_sdk_loggers() -> None:
    """Each store names its SDK's loggers in its options.py; the registry is the one list."""
    from backends import registry
    from provider.edge import logs

    assert {"botocore", "google", "azure"} <= set(registry.sdk_loggers())
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    levels = {n: logging.getLogger(n).level for n in registry.sdk_loggers()}
    try:
        logs.configure("debug", "json", stream=io.StringIO())
        assert all(logging.getLogger(n).level == logging.WARNING for n in levels)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
