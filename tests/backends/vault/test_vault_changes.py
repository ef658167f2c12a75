"""Vault's change source against a real OpenBao: its socket audit device dials the source, whose
changes (handed to a recording Feed, the seam the watcher fills) name each KV write as the
dialect's `subject` names the refs that read it; reads, failed writes and hostile input do not
publish, and the canary reports the stream up or down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests

from backends.vault import changes
from backends.vault.changes import AuditSource, Canary
from backends.vault.dialect import VaultStore, parse, subject
from backends.vault.objects import VaultRef
from backends.vault.options import Options
from backends.vault.selectors import VaultSelection
from devkit.feeds import RecordingFeed
from devkit.openbao import ROOT_TOKEN, OpenBao
from devkit.ports import closed_url, free_port
from provider.core.changes import Change, Subject
from provider.core.model import ParseContext


@pytest.fixture(scope="module")
def audit_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory, audit_port: int) -> Iterator[OpenBao]:
    server = OpenBao.start(
        Path(tmp_path_factory.mktemp("openbao-feed")), socket_audit=f"127.0.0.1:{audit_port}"
    )
    try:
        server.enable_kv("kv1", 1)
        server.create_namespace("team")
        server.enable_kv("secret", 2, vault_namespace="team")
        yield server
    finally:
        server.stop()


async def until(done: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)


async def running(source: AuditSource, feed: RecordingFeed) -> asyncio.Task[None]:
    await source.start()
    return asyncio.create_task(source.run(feed))


async def stopped(source: AuditSource, task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await source.close()


@pytest.fixture
async def fed(bao: OpenBao, audit_port: int) -> AsyncIterator[tuple[AuditSource, RecordingFeed]]:
    """A source on the port Vault dials, connected: Vault loses the first entry it writes to
    the previous test's closed connection, then dials again, so a read is repeated until one
    arrives."""
    source = AuditSource(listen=("127.0.0.1", audit_port), addresses=[bao.addr + "/"])
    feed = RecordingFeed()
    task = await running(source, feed)
    for _ in range(50):
        seen = source.counts.entries
        bao.root().read("cubbyhole/settle")
        try:
            await until(lambda s=seen: source.counts.entries > s, "an entry", timeout=0.2)
            break
        except AssertionError:
            continue
    yield source, feed
    await stopped(source, task)


async def published(feed: RecordingFeed, bao: OpenBao, step: Callable[[], Any]) -> list[str]:
    """The names published for `step`, closed by a KV v1 write waited for."""
    start = len(feed.changes)
    step()
    sentinel = f"kv1/sentinel/{time.monotonic_ns()}"
    bao.root().write(sentinel, done="yes")
    await until(lambda: sentinel in feed.names[start:], f"the change of {sentinel}")
    return [n for n in feed.names[start:] if n != sentinel]


def patch(bao: OpenBao, path: str, data: dict[str, str]) -> None:
    """A KV v2 PATCH (operation patch; hvac's patch reads, then writes)."""
    reply = requests.patch(
        f"{bao.addr}/v1/{path}",
        json={"data": data},
        headers={"X-Vault-Token": ROOT_TOKEN, "Content-Type": "application/merge-patch+json"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text


def store_of(bao: OpenBao, objects: str, **params: str) -> tuple[VaultStore, list[VaultRef]]:
    plan = parse(
        {"roleName": "app", "vaultAddress": bao.addr, "objects": objects, **params},
        ParseContext(options=Options()),
    )
    assert isinstance(plan.store, VaultStore)
    refs = [spec.ref for spec in plan.objects]
    assert all(isinstance(r, VaultRef) for r in refs)
    return plan.store, refs  # type: ignore[return-value]


async def test_each_kv_write_is_one_change_named_as_its_refs_are(
    bao: OpenBao, fed: tuple[AuditSource, RecordingFeed]
) -> None:
    source, feed = fed
    root, kv2, team = bao.root(), bao.root().secrets.kv.v2, bao.root("team").secrets.kv.v2
    steps: list[tuple[Callable[[], Any], str]] = [
        (lambda: root.write("kv1/app/x", a="1"), "kv1/app/x"),
        (lambda: root.write("kv1/app/x", a="2"), "kv1/app/x"),
        (lambda: kv2.create_or_update_secret("app/y", secret={"a": "1"}), "secret/app/y"),
        (lambda: patch(bao, "secret/data/app/y", {"b": "2"}), "secret/app/y"),
        (lambda: kv2.update_metadata("app/y", max_versions=5), "secret/app/y"),
        (lambda: kv2.delete_secret_versions("app/y", versions=[1]), "secret/app/y"),
        (lambda: kv2.undelete_secret_versions("app/y", versions=[1]), "secret/app/y"),
        (lambda: kv2.destroy_secret_versions("app/y", versions=[1]), "secret/app/y"),
        (lambda: kv2.delete_latest_version_of_secret("app/y"), "secret/app/y"),
        (lambda: kv2.delete_metadata_and_all_versions("app/y"), "secret/app/y"),
        (lambda: team.create_or_update_secret("z", secret={"a": "1"}), "team/secret/z"),
        (lambda: root.delete("kv1/app/x"), "kv1/app/x"),
    ]
    for step, name in steps:
        assert await published(feed, bao, step) == [name]
    assert {(c.store, c.scope) for c in feed.changes} == {("vault", bao.addr)}
    assert source.scopes == frozenset({bao.addr})
    # A KV v2 data write's marker is its version; nothing of the value is kept.
    kv2.create_or_update_secret("app/marked", secret={"password": "hunter2"})
    await until(lambda: "secret/app/marked" in feed.names, "the marked write")
    change = next(c for c in feed.changes if c.name == "secret/app/marked")
    assert change.marker == "v1"
    assert "hunter2" not in repr(feed.changes)


async def test_reads_failed_writes_and_other_mounts_publish_nothing(
    bao: OpenBao, fed: tuple[AuditSource, RecordingFeed]
) -> None:
    _source, feed = fed
    root, kv2 = bao.root(), bao.root().secrets.kv.v2
    denied = root.auth.token.create(policies=["default"], ttl="5m")["auth"]["client_token"]

    def reads() -> None:
        kv2.read_secret_version("app/read", raise_on_deleted_version=False)
        kv2.read_secret_metadata("app/read")
        kv2.list_secrets("app")
        root.read("kv1/app/read")
        root.list("kv1/app")

    def failed_writes() -> None:
        with pytest.raises(Exception, match="check-and-set"):
            kv2.create_or_update_secret("app/read", secret={"a": "2"}, cas=99)
        reply = requests.post(
            f"{bao.addr}/v1/kv1/app/read",
            json={"a": "3"},
            headers={"X-Vault-Token": denied},
            timeout=10,
        )
        assert reply.status_code == 403

    def other_mounts() -> None:
        root.write("cubbyhole/mine", a="1")
        bao.put_policy("feed-test", 'path "kv1/*" { capabilities = ["read"] }')

    def seed() -> None:
        kv2.create_or_update_secret("app/read", secret={"a": "1"})
        root.write("kv1/app/read", a="1")

    assert await published(feed, bao, seed) == ["secret/app/read", "kv1/app/read"]
    assert await published(feed, bao, reads) == []
    assert await published(feed, bao, failed_writes) == []
    assert await published(feed, bao, other_mounts) == []


async def test_the_subject_of_each_ref_kind_is_the_name_its_writes_publish(
    bao: OpenBao, fed: tuple[AuditSource, RecordingFeed]
) -> None:
    _source, feed = fed
    root, kv2, team = bao.root(), bao.root().secrets.kv.v2, bao.root("team").secrets.kv.v2
    objects = (
        "- {objectName: v2, secretPath: secret/data/meet/a, secretKey: k}\n"
        "- {objectName: v2-version, secretPath: '/v1/secret/data/meet/a?version=1'}\n"
        "- {objectName: v2-metadata, secretPath: secret/metadata/meet/a}\n"
        "- {objectName: v1, secretPath: kv1/meet/b, secretKey: k}\n"
        "- {objectName: ns-in-path, secretPath: team/secret/data/meet/c}\n"
        "- {objectName: escaped, secretPath: 'kv1/meet/with%20space'}\n"
    )
    store, refs = store_of(bao, objects)
    team_store, team_refs = store_of(
        bao, "- {objectName: c, secretPath: secret/data/meet/c}\n", vaultNamespace="team"
    )
    writes = [
        lambda: kv2.create_or_update_secret("meet/a", secret={"k": "1"}),
        lambda: kv2.create_or_update_secret("meet/a", secret={"k": "2"}),
        lambda: kv2.update_metadata("meet/a", max_versions=3),
        lambda: root.write("kv1/meet/b", k="1"),
        lambda: team.create_or_update_secret("meet/c", secret={"k": "1"}),
        lambda: root.write("kv1/meet/with space", k="1"),
    ]
    for ref, write in zip(refs, writes, strict=True):
        [name] = await published(feed, bao, write)
        assert subject(store, ref) == Subject(bao.addr, name), ref
    [name] = await published(feed, bao, writes[4])
    assert subject(team_store, team_refs[0]) == Subject(bao.addr, name)

    # A selection answers to every secret under its KV path, in either KV version.
    for path, write in [
        ("secret/meet", lambda: kv2.create_or_update_secret("meet/deep/d", secret={"k": "1"})),
        ("kv1/meet", lambda: root.write("kv1/meet/deep/e", k="1")),
    ]:
        selected = subject(store, VaultSelection(path, 5, 100, True))
        assert selected is not None and selected.prefix and selected.scope == bao.addr
        [name] = await published(feed, bao, write)
        assert name.startswith(selected.name)
    team_selected = subject(team_store, VaultSelection("secret/meet", 0, 100))
    assert team_selected == Subject(bao.addr, "team/secret/meet/", prefix=True)

    # Dynamic credentials and certificates are held per pod: in no feed.
    dynamic, _ = store_of(bao, "- {objectName: x, secretPath: kv1/x}\n")
    for ref in [
        VaultRef("database/creds/app"),
        VaultRef("pki/issue/web", method="POST", body='{"common_name":"a"}'),
        VaultRef("aws/sts/deploy", method="POST"),
        VaultRef("sys/tools/random/32"),
    ]:
        assert subject(dynamic, ref) is None, ref


async def test_a_refused_publish_is_tried_again(
    bao: OpenBao, fed: tuple[AuditSource, RecordingFeed]
) -> None:
    _source, feed = fed
    feed.refuse = 1
    bao.root().write("kv1/app/retried", a="1")
    await until(lambda: "kv1/app/retried" in feed.names, "the retried change")


async def test_without_a_listener_vault_still_serves_and_then_dials_again(
    bao: OpenBao, audit_port: int
) -> None:
    # Nothing listens: the socket device fails, the file device records, the write succeeds.
    bao.audit_mark()
    bao.root().write("kv1/app/unheard", a="1")
    assert bao.audit_counts(exclude_root=False)[("create", "kv1/app/unheard")] == 1
    source = AuditSource(listen=("127.0.0.1", audit_port), addresses=[bao.addr])
    feed = RecordingFeed()
    task = await running(source, feed)
    try:
        # Vault may lose one more entry to the connection it had before the outage.
        for _ in range(3):
            bao.root().write("kv1/app/heard", a="1")
            with contextlib.suppress(AssertionError):
                await until(lambda: "kv1/app/heard" in feed.names, "the write", timeout=1.0)
        assert "kv1/app/heard" in feed.names
        # What Vault wrote while nobody listened is not replayed.
        assert "kv1/app/unheard" not in feed.names
    finally:
        await stopped(source, task)


async def test_hostile_input_is_bounded_and_skipped() -> None:
    source = AuditSource(listen=("127.0.0.1", 0), addresses=["http://vault:8200"], max_line=4096)
    feed = RecordingFeed()
    task = await running(source, feed)
    host, port = await source.start()
    forged = {
        "type": "response",
        "request": {"operation": "update", "mount_type": "kv", "path": "secret/data/forged"},
    }
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"not json\n\xff\xfe\n[1, 2]\n" + b"[" * 3000 + b"\n\n")
        # A line with no end in sight: held to max_line, skipped to its newline, counted once,
        # and a valid-looking entry at its end goes with it.
        for _ in range(64):
            writer.write(b"x" * 16384)
        writer.write(json.dumps(forged).encode() + b"\n")
        writer.write(json.dumps({**forged, "error": "permission denied"}).encode() + b"\n")
        writer.write(json.dumps(forged).encode() + b"\n")
        await writer.drain()
        await until(lambda: feed.names == ["secret/forged"], "the well-formed entry")
        assert source.counts.overlong == 1
        assert source.skips.count == 5  # 3 not objects, 1 too deep, 1 too long
        assert source.counts.entries == 2
        assert feed.ups >= 1  # without a canary, entries read are the sign of life

        # Connections are few: the oldest make way for newcomers.
        crowd = [
            await asyncio.open_connection(host, port) for _ in range(3 * changes.MAX_CONNECTIONS)
        ]
        await until(lambda: source.counts.evicted >= 2 * changes.MAX_CONNECTIONS + 1, "evictions")
        assert len(source._connections) <= changes.MAX_CONNECTIONS
        assert await reader.read() == b""  # the first connection was closed
        for _, w in crowd:
            w.close()
        await until(lambda: "no audit connection from Vault" in feed.downs, "down when alone")
    finally:
        await stopped(source, task)


async def test_the_canary_is_up_while_its_read_comes_back(
    bao: OpenBao, audit_port: int, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token = bao.root().auth.token.create(policies=["default"], ttl="5m")["auth"]["client_token"]
    token_file.write_text(token + "\n")
    canary = Canary(bao.addr, str(token_file), interval=0.1, timeout=3.0)
    source = AuditSource(listen=("127.0.0.1", audit_port), addresses=[bao.addr], canary=canary)
    feed = RecordingFeed()
    task = await running(source, feed)
    try:
        # The first read may be the entry Vault loses to the previous test's closed connection.
        await until(lambda: feed.ups >= 2, "the canary's reads coming back")
        assert not source._awaited
    finally:
        await stopped(source, task)


@pytest.mark.parametrize("reachable", [True, False])
async def test_the_canary_is_down_when_its_read_does_not_come_back(
    bao: OpenBao, tmp_path: Path, reachable: bool
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(ROOT_TOKEN)
    # Vault answers but audits elsewhere (not to this source), or does not answer at all.
    address = bao.addr if reachable else closed_url()
    canary = Canary(address, str(token_file), interval=0.1, timeout=0.3)
    source = AuditSource(listen=("127.0.0.1", 0), addresses=[bao.addr], canary=canary)
    feed = RecordingFeed()
    task = await running(source, feed)
    try:
        await until(lambda: bool(feed.downs), "down")
        expected = "did not come back" if reachable else "did not answer"
        assert expected in feed.downs[0] and feed.ups == 0
        assert ROOT_TOKEN not in feed.downs[0]
    finally:
        await stopped(source, task)


async def test_a_backlog_past_its_bound_drops_and_reports_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(changes, "MAX_PENDING", 4)
    released = asyncio.Event()

    class StuckFeed(RecordingFeed):
        publishing = False

        async def publish(self, batch: Sequence[Change]) -> None:
            self.publishing = True
            await released.wait()
            await super().publish(batch)

    source = AuditSource(listen=("127.0.0.1", 0), addresses=["http://vault:8200"])
    feed = StuckFeed()
    task = await running(source, feed)
    try:
        _, writer = await asyncio.open_connection(*await source.start())
        for n in range(10):
            entry = {
                "type": "response",
                "request": {"operation": "create", "mount_type": "kv", "path": f"kv/{n}"},
            }
            writer.write(json.dumps(entry).encode() + b"\n")
            if n == 0:
                await until(lambda: feed.publishing, "the first publish")
        await writer.drain()
        # One batch is out to the stuck publish, four wait, the rest are dropped.
        await until(lambda: source.counts.dropped == 5, "drops")
        assert len(feed.downs) == 1 and "dropped" in feed.downs[0]
        ups = feed.ups
        released.set()
        await until(lambda: len(feed.changes) == 5 and feed.ups > ups, "the backlog published")
        writer.close()
    finally:
        await stopped(source, task)


def test_create_reads_the_watchers_settings() -> None:
    plain = changes.create(listen=":8201", addresses=["https://vault:8200/", "https://v:8200"])
    assert (plain._listen, plain._canary) == ((None, 8201), None)
    assert (plain.scope, plain.scopes) == (
        "https://vault:8200",
        frozenset({"https://vault:8200", "https://v:8200"}),
    )
    assert (plain.store, plain.name, plain.pulled) == ("vault", "vault", False)
    canary = changes.create(
        listen="[::1]:8201", addresses=["https://vault:8200"], token_file="/t", canary_interval=5
    )
    assert canary._listen == ("::1", 8201)
    assert canary._canary == Canary("https://vault:8200", "/t", interval=5)
