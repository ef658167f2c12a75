"""Azure Key Vault's change source against Azurite, the real Storage queue emulator: events
enqueued as Event Grid delivers them (base64 of the JSON, Event Grid and CloudEvents schemas)
become changes named as the dialect's `subject` names the refs that read them, handed to a
recording Feed; messages are deleted only after the publish returned, so a refused publish is
received again after the visibility timeout; messages that are no event to publish are deleted
and never logged; batches are bounded; a queue that stops answering is reported down."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from azure.storage.queue.aio import QueueClient

from backends.azure import changes
from backends.azure.changes import QueueSource, changes_of
from backends.azure.dialect import AzureStore, subject
from backends.azure.objects import AzureRef
from backends.azure.selectors import AzureSelection
from devkit.azurite import AzuriteQueue, azurite_queue
from devkit.feeds import RecordingFeed
from provider.core.changes import Change, Subject

VAULT = "Team-Vault"
STORE = AzureStore("Team-Vault", "tenant.example", "AzurePublicCloud", "", "workload-identity")
TOPIC = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.KeyVault/vaults/Team-Vault"


class HeldFeed(RecordingFeed):
    """A recording feed whose each publish also notes how many messages the queue still held
    (none may be deleted before it returned)."""

    def __init__(self, client: QueueClient) -> None:
        super().__init__()
        self.client = client
        self.held_at_publish: list[int] = []

    async def publish(self, changes: Sequence[Change]) -> None:
        properties = await self.client.get_queue_properties()
        self.held_at_publish.append(properties.approximate_message_count)
        await super().publish(changes)


def event(kind: str, object_type: str, name: str, *, cloud: bool = False) -> dict[str, Any]:
    """A Key Vault event as Event Grid sends it, in either delivery schema."""
    data = {
        "Id": f"https://team-vault.vault.azure.net/{object_type.lower()}s/{name}/v2",
        "VaultName": VAULT,
        "ObjectType": object_type,
        "ObjectName": name,
        "Version": "v2",
        "NBF": None,
        "EXP": None,
    }
    if cloud:
        return {
            "specversion": "1.0",
            "id": str(uuid.uuid4()),
            "source": TOPIC,
            "subject": name,
            "type": f"Microsoft.KeyVault.{kind}",
            "time": "2026-12-03T17:00:00Z",
            "data": data,
        }
    return {
        "id": str(uuid.uuid4()),
        "topic": TOPIC,
        "subject": name,
        "eventType": f"Microsoft.KeyVault.{kind}",
        "eventTime": "2026-12-03T17:00:00Z",
        "data": data,
        "dataVersion": "1",
        "metadataVersion": "1",
    }


def delivered(body: Any) -> str:
    """A queue message's text as Event Grid writes it: base64 of the JSON."""
    return base64.b64encode(json.dumps(body).encode()).decode()


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteQueue]:
    with azurite_queue(tmp_path_factory.mktemp("azurite")) as queue:
        yield queue


class Rig:
    def __init__(self, azurite: AzuriteQueue, tmp_path: Path) -> None:
        self.queue = f"events-{uuid.uuid4().hex[:12]}"
        self.url = azurite.queue_url(self.queue)
        self.connection = tmp_path / "connection-string"
        self.connection.write_text(azurite.connection_string)
        self.client = QueueClient.from_connection_string(azurite.connection_string, self.queue)
        self.feed = HeldFeed(self.client)
        self.source: QueueSource | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self, **options: Any) -> QueueSource:
        defaults: dict[str, Any] = {"poll": 0.05, "backoff": (0.05, 0.2), "visibility": 1}
        self.source = changes.create(
            queue_url=self.url,
            vaults=[VAULT],
            connection_string_file=str(self.connection),
            **{**defaults, **options},
        )
        self.task = asyncio.create_task(self.source.run(self.feed))
        return self.source

    async def send(self, *texts: str) -> None:
        for text in texts:
            await self.client.send_message(text)

    async def held(self) -> int:
        return (await self.client.get_queue_properties()).approximate_message_count

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.source is not None:
            await self.source.close()
        await self.client.close()


@pytest.fixture
async def rig(azurite: AzuriteQueue, tmp_path: Path) -> AsyncIterator[Rig]:
    rig = Rig(azurite, tmp_path)
    await rig.client.create_queue()
    try:
        yield rig
    finally:
        await rig.stop()


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await _value(check()):
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _value(result: Any) -> Any:
    return await result if asyncio.iscoroutine(result) else result


async def test_events_are_published_then_deleted(rig: Rig) -> None:
    await rig.send(
        delivered(event("SecretNewVersionCreated", "Secret", "Db-Pass")),
        delivered(event("KeyNewVersionCreated", "Key", "signing", cloud=True)),
        delivered(event("CertificateNewVersionCreated", "Certificate", "tls")),
        delivered(event("SecretExpired", "Secret", "old-token", cloud=True)),
        json.dumps(event("SecretNewVersionCreated", "Secret", "plain")),  # older plain deliveries
    )
    source = rig.start()
    await eventually(lambda: len(rig.feed.changes) == 7)
    await eventually(lambda: _empty(rig))
    names = {c.name for c in rig.feed.changes}
    assert names == {
        "secret/db-pass",
        "key/signing",
        "cert/tls",
        "secret/tls",
        "key/tls",
        "secret/old-token",
        "secret/plain",
    }
    assert {c.scope for c in rig.feed.changes} == {"team-vault"}
    assert {c.store for c in rig.feed.changes} == {"azure"}
    assert "SecretNewVersionCreated v2" in {c.marker for c in rig.feed.changes}
    # Every message was still in the queue while its batch was published.
    assert rig.feed.held_at_publish and min(rig.feed.held_at_publish) >= 1
    assert sum(rig.feed.held_at_publish[:1]) == 5
    assert source.counts.acknowledged == 5 and source.skips.count == 0
    assert rig.feed.ups >= 1 and not rig.feed.downs


async def _empty(rig: Rig) -> bool:
    return await rig.held() == 0


async def test_a_refused_publish_leaves_the_messages_for_redelivery(rig: Rig) -> None:
    rig.feed.refuse = 1
    await rig.send(delivered(event("SecretNewVersionCreated", "Secret", "db-pass")))
    source = rig.start(visibility=1)
    await eventually(lambda: rig.feed.changes)
    assert source.counts.publish_failures == 1
    assert len(rig.feed.held_at_publish) == 2  # refused, then received again and published
    assert [c.name for c in rig.feed.changes] == ["secret/db-pass"]
    await eventually(lambda: _empty(rig))


async def test_a_message_delivered_too_often_is_deleted_unread(rig: Rig) -> None:
    rig.feed.refuse = 100
    await rig.send(delivered(event("SecretNewVersionCreated", "Secret", "db-pass")))
    source = rig.start(visibility=1, max_dequeue=2)
    await eventually(lambda: _empty(rig))
    assert source.counts.publish_failures == 2 and source.skips.count == 1
    assert not rig.feed.changes


async def test_bad_messages_are_deleted_counted_and_never_logged(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    secret_text = "s3cr3t-body-never-logged"
    other = event("SecretNewVersionCreated", "Secret", "db-pass")
    other["data"]["VaultName"] = "someone-elses"
    no_name = event("SecretNewVersionCreated", "Secret", "")
    await rig.send(
        secret_text,
        delivered(secret_text),
        delivered([secret_text]),
        delivered({"eventType": "Microsoft.Storage.BlobCreated", "data": {"x": secret_text}}),
        delivered(other),
        delivered(no_name),
        delivered([event("SecretNewVersionCreated", "Secret", "x")] * 17),
        delivered(event("SecretNearExpiry", "Secret", "db-pass")),  # quiet: no new value
    )
    with caplog.at_level(logging.WARNING, logger="secrets_bridge.azure"):
        source = rig.start()
        await eventually(lambda: _empty(rig))
    assert not rig.feed.changes
    assert source.skips.count == 7 and source.counts.acknowledged == 8
    assert secret_text not in caplog.text
    assert len([r for r in caplog.records if "deleted" in r.getMessage()]) == 1


async def test_a_flood_is_received_in_bounded_batches(rig: Rig) -> None:
    names = [f"s-{i}" for i in range(40)]
    await asyncio.gather(
        *(rig.send(delivered(event("SecretNewVersionCreated", "Secret", n))) for n in names)
    )
    rig.start(batch=8)
    await eventually(lambda: len(rig.feed.changes) == 40)
    assert max(len(b) for b in rig.feed.batches) <= 8
    assert {c.name for c in rig.feed.changes} == {f"secret/{n}" for n in names}
    await eventually(lambda: _empty(rig))


async def test_a_queue_that_stops_answering_is_reported_down(tmp_path: Path) -> None:
    with azurite_queue(tmp_path / "azurite") as own:
        rig = Rig(own, tmp_path)
        await rig.client.create_queue()
        try:
            rig.start()
            await eventually(lambda: rig.feed.ups)
            own.stop()
            await eventually(lambda: rig.feed.downs)
        finally:
            await rig.stop()
    assert rig.feed.downs[0].startswith(f"queue {rig.queue}: ")
    assert "the queue did not answer" in rig.feed.downs[0]


async def test_a_missing_queue_is_reported_down(azurite: AzuriteQueue, tmp_path: Path) -> None:
    rig = Rig(azurite, tmp_path)  # its queue never created
    try:
        rig.start()
        await eventually(lambda: rig.feed.downs)
    finally:
        await rig.stop()
    assert rig.feed.downs[0] == f"queue {rig.queue}: HTTP 404: the queue does not exist"


@pytest.mark.parametrize(
    ("ref", "kind", "object_type"),
    [
        (AzureRef("secret", "Db-Pass"), "SecretNewVersionCreated", "Secret"),
        (AzureRef("secret", "db-pass", version="v1"), "SecretExpired", "Secret"),
        (AzureRef("key", "Signing"), "KeyNewVersionCreated", "Key"),
        (AzureRef("cert", "tls"), "CertificateNewVersionCreated", "Certificate"),
        # A certificate read through its secret (PFX or PEM with the key) or its key.
        (AzureRef("secret", "tls", pfx=True), "CertificateNewVersionCreated", "Certificate"),
        (AzureRef("key", "TLS"), "CertificateNewVersionCreated", "Certificate"),
    ],
)
def test_a_refs_subject_is_what_its_event_names(ref: AzureRef, kind: str, object_type: str) -> None:
    for cloud in (False, True):
        vault, found = changes_of(event(kind, object_type, ref.name.swapcase(), cloud=cloud))
        expected = subject(STORE, ref)
        assert expected is not None and expected.scope == vault
        assert expected.name in {c.name for c in found}


def test_a_selections_subject_is_a_prefix_of_the_secrets_it_selects() -> None:
    by_prefix = subject(STORE, AzureSelection("App-", (), 10))
    by_tags = subject(STORE, AzureSelection("", (("team", "payments"),), 10))
    assert by_prefix == Subject("team-vault", "secret/app-", prefix=True)
    assert by_tags == Subject("team-vault", "secret/", prefix=True)
    _, found = changes_of(event("SecretNewVersionCreated", "Secret", "APP-db"))
    assert found[0].name.startswith(by_prefix.name)
