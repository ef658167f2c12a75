"""Google Secret Manager's change source, with the real Pub/Sub client against devkit's Pub/Sub
wire fake: notifications published then pulled become changes named as the dialect's `subject`
names the refs that read them (handed to a recording Feed, the seam the watcher fills); a batch
is acknowledged only after its publish returned, so a refused publish is delivered again once the
ack deadline passed; duplicates, the topic's test message and messages that are no notification
are harmless; batches are bounded; a Pub/Sub that stops answering is reported down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc
import pytest
from google.api_core import exceptions, grpc_helpers_async
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import DefaultCredentialsError
from google.oauth2.credentials import Credentials
from google.pubsub_v1.services.publisher import PublisherAsyncClient
from google.pubsub_v1.services.publisher.transports import PublisherGrpcAsyncIOTransport
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport
from google.pubsub_v1.types import pubsub

from backends.gcp import changes
from backends.gcp.changes import SubscriptionSource, change_of
from backends.gcp.dialect import GcpRef, GcpStore, subject
from backends.gcp.selection import GcpSelection
from devkit.feeds import RecordingFeed
from devkit.pubsub import FakePubSub, start_pubsub
from provider.core.changes import Change, Subject

TOPIC = "projects/watch-proj/topics/secrets"
SUBSCRIPTION = "projects/watch-proj/subscriptions/secrets-bridge"
#: The project as classes write it, and as notifications name it.
PROJECT_ID, PROJECT_NUMBER = "my-proj", "123456789012"
TOKEN = "ya29.watcher"
STORE = GcpStore(auth="pod-adc", auth_explicit=False, audience=None)


@dataclass
class Rig:
    fake: FakePubSub
    server: grpc.aio.Server
    port: int
    feed: RecordingFeed
    source: SubscriptionSource
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.source.run(self.feed))

    def notify(self, event: str, secret: str, version: str = "", **extra: str) -> None:
        attributes = {"eventType": event, "secretId": secret, "dataFormat": "JSON_API_V1"}
        if version:
            attributes["versionId"] = f"{secret}/versions/{version}"
        self.fake.publish(TOPIC, b'{"name": "' + secret.encode() + b'"}', **attributes, **extra)


def _source(port: int, credentials: object = None, **kw: object) -> SubscriptionSource:
    return changes.create(
        subscription=str(kw.pop("subscription", SUBSCRIPTION)),
        projects=[PROJECT_ID, PROJECT_NUMBER],
        endpoint=f"127.0.0.1:{port}",
        local_channel=True,
        credentials=credentials or Credentials(token=TOKEN),  # type: ignore[arg-type]
        # An idle pull is held this long (Pub/Sub holds it until the deadline).
        pull_timeout=0.5,
        backoff=(0.05, 0.2),
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    fake = FakePubSub(tokens={TOKEN})
    fake.add_subscription(SUBSCRIPTION, TOPIC, ack_deadline=10)
    server, port = await start_pubsub(fake)
    rig = Rig(fake, server, port, RecordingFeed(), _source(port))
    yield rig
    if rig.task is not None:
        rig.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await rig.task
    await rig.source.close()
    await server.stop(0)


async def until(check: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def secret(name: str, project: str = PROJECT_NUMBER, location: str = "") -> str:
    where = f"/locations/{location}" if location else ""
    return f"projects/{project}{where}/secrets/{name}"


# -- notifications become changes -------------------------------------------------------------


async def test_notifications_published_then_pulled_become_changes(rig: Rig) -> None:
    rig.start()
    rig.notify("SECRET_VERSION_ADD", secret("db"), "4")
    rig.notify("SECRET_VERSION_DISABLE", secret("api", location="europe-west1"), "2")
    rig.notify("SECRET_DELETE", secret("old"))
    await until(lambda: len(rig.feed.changes) == 3 and rig.fake.outstanding(SUBSCRIPTION) == 0)
    assert {(c.store, c.scope, c.name, c.marker) for c in rig.feed.changes} == {
        ("gcp", PROJECT_NUMBER, "secrets/db", "SECRET_VERSION_ADD 4"),
        ("gcp", PROJECT_NUMBER, "locations/europe-west1/secrets/api", "SECRET_VERSION_DISABLE 2"),
        ("gcp", PROJECT_NUMBER, "secrets/old", "SECRET_DELETE"),
    }
    assert rig.feed.ups >= 1 and not rig.feed.downs
    assert rig.fake.counts.acked == 3 and rig.source.counts.acknowledged == 3
    # The watcher's own token on every call.
    assert set(rig.fake.callers) == {f"Bearer {TOKEN}"}
    assert rig.source.pulled and rig.source.store == "gcp"
    assert rig.source.scopes == {PROJECT_ID, PROJECT_NUMBER}


@pytest.mark.parametrize(
    "event",
    [
        "SECRET_VERSION_ADD",
        "SECRET_VERSION_ENABLE",
        "SECRET_VERSION_DISABLE",
        "SECRET_VERSION_DESTROY",
        "SECRET_VERSION_DESTROY_SCHEDULED",
        "SECRET_DELETE",
        "SECRET_UPDATE",
        "SECRET_ROTATE",
        "SECRET_CREATE",
    ],
)
def test_each_event_type_names_its_secret(event: str) -> None:
    message = pubsub.PubsubMessage(
        attributes={
            "eventType": event,
            "secretId": secret("db"),
            "versionId": secret("db") + "/versions/7",
        }
    )
    change = change_of(message)
    assert change is not None and (change.scope, change.name) == (PROJECT_NUMBER, "secrets/db")
    assert change.marker == f"{event} 7"


async def test_idle_pulls_are_answers(rig: Rig) -> None:
    """Pub/Sub holds a Pull with nothing to deliver until its deadline: on a live connection
    that is an idle answer, not an outage."""
    rig.start()
    await until(lambda: rig.feed.ups >= 2, timeout=4)
    assert not rig.feed.downs and not rig.feed.changes


# -- acknowledged only after publish --------------------------------------------------------


async def test_a_refused_publish_is_delivered_again_after_the_ack_deadline(rig: Rig) -> None:
    rig.feed.refuse = 1
    rig.start()
    rig.notify("SECRET_VERSION_ADD", secret("db"), "5")
    await until(lambda: rig.source.counts.publish_failures == 1)
    await asyncio.sleep(0.3)
    # Not acknowledged: still leased, and nothing delivered again before the deadline.
    assert rig.fake.counts.acked == 0 and rig.fake.outstanding(SUBSCRIPTION) == 1
    assert rig.fake.counts.redelivered == 0 and not rig.feed.changes
    rig.fake.advance(10)  # the subscription's ack deadline passes
    await until(lambda: rig.fake.outstanding(SUBSCRIPTION) == 0)
    assert [c.name for c in rig.feed.changes] == ["secrets/db"]
    assert rig.fake.counts.redelivered == 1 and rig.fake.counts.acked == 1


async def test_an_ack_after_the_lease_ended_is_ignored_like_pubsub(rig: Rig) -> None:
    """A publish slower than the ack deadline: Pub/Sub ignores the late ack and delivers the
    message again; the second delivery is published and acknowledged in time."""
    slow = asyncio.Event()
    publish = rig.feed.publish

    async def late(batch: Sequence[Change]) -> None:
        if not slow.is_set():
            slow.set()
            rig.fake.advance(11)
        await publish(batch)

    rig.feed.publish = late  # type: ignore[method-assign]
    rig.start()
    rig.notify("SECRET_VERSION_ADD", secret("db"), "6")
    await until(lambda: rig.fake.outstanding(SUBSCRIPTION) == 0)
    assert rig.fake.counts.ignored_acks == 1 and rig.fake.counts.acked == 1
    assert [c.marker for c in rig.feed.changes] == ["SECRET_VERSION_ADD 6"] * 2


async def test_duplicates_are_harmless(rig: Rig) -> None:
    rig.fake.duplicates = 1.0
    rig.start()
    for version in ("1", "2", "3"):
        rig.notify("SECRET_VERSION_ADD", secret("db"), version)
    rig.notify("SECRET_VERSION_ADD", secret("api"), "1")
    await until(lambda: rig.fake.outstanding(SUBSCRIPTION) == 0)
    assert rig.fake.counts.delivered > 4  # handed out twice
    # One record per secret and batch, whatever the copies and repeats.
    for batch in rig.feed.batches:
        assert len({c.name for c in batch}) == len(batch)
    assert {c.name for c in rig.feed.changes} == {"secrets/db", "secrets/api"}
    assert not rig.feed.downs


# -- hostile or foreign messages --------------------------------------------------------------


async def test_bad_messages_are_acknowledged_counted_and_never_logged(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.start()
    body = "s3cr3t-body-never-logged"
    rig.fake.publish(TOPIC, body.encode(), note=body)  # no eventType
    rig.fake.publish(TOPIC, b"", eventType="SECRET_VERSION_ADD", secretId=f"/etc/{body}")
    rig.fake.publish(TOPIC, b"", eventType="SECRET_VERSION_ADD", secretId="x" * 5000)
    rig.fake.publish(TOPIC, b"x" * (changes.MAX_MESSAGE + 1), eventType="SECRET_DELETE")
    rig.fake.publish(TOPIC, b"", eventType="TOPIC_CONFIGURED")  # the topic's test message
    rig.notify("SECRET_VERSION_ADD", secret("db"), "1")
    with caplog.at_level(logging.WARNING, logger="secrets_bridge.gcp"):
        await until(lambda: rig.fake.outstanding(SUBSCRIPTION) == 0)
    assert [c.name for c in rig.feed.changes] == ["secrets/db"]
    assert rig.source.skips.count == 4 and rig.fake.counts.acked == 6
    assert body not in caplog.text
    assert len([r for r in caplog.records if "not Secret Manager notifications" in r.message]) == 1
    assert rig.fake.counts.redelivered == 0


async def test_bad_messages_are_acknowledged_even_when_publish_is_refused(rig: Rig) -> None:
    rig.feed.refuse = 1
    rig.fake.publish(TOPIC, b"junk")
    rig.notify("SECRET_VERSION_ADD", secret("db"), "1")
    rig.source = _source(rig.port, batch=2)
    rig.start()
    await until(lambda: rig.source.counts.publish_failures == 1)
    await until(lambda: rig.fake.counts.acked == 1)
    assert rig.fake.outstanding(SUBSCRIPTION) == 1  # the change's message, left to its lease


async def test_a_flood_is_pulled_in_bounded_batches(rig: Rig) -> None:
    for n in range(1000):
        rig.notify("SECRET_VERSION_ADD", secret(f"s{n}"), "1")
    rig.source = _source(rig.port, batch=50)
    rig.start()
    await until(lambda: rig.fake.outstanding(SUBSCRIPTION) == 0, timeout=15)
    assert max(len(b) for b in rig.feed.batches) == 50
    assert len({c.name for c in rig.feed.changes}) == 1000
    assert rig.fake.counts.redelivered == 0


async def test_a_large_message_halves_the_batch_until_it_fits(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pull's answer over the receive bound is refused by gRPC (its messages stay leased
    until the ack deadline): the source asks for fewer, so a huge message is pulled alone and
    acknowledged as not a notification."""
    monkeypatch.setattr(changes, "MAX_RECEIVE", 4 * 1024 * 1024)
    for _ in range(4):
        rig.fake.publish(TOPIC, b"x" * (3 * 1024 * 1024), eventType="SECRET_DELETE")
    rig.notify("SECRET_VERSION_ADD", secret("db"), "1")
    rig.source = _source(rig.port, batch=4)
    rig.start()
    for _ in range(40):
        if rig.fake.outstanding(SUBSCRIPTION) == 0:
            break
        await asyncio.sleep(0.25)
        rig.fake.advance(10)  # leases of refused answers run out
    assert rig.fake.outstanding(SUBSCRIPTION) == 0
    assert any("RESOURCE_EXHAUSTED" in d for d in rig.feed.downs)
    assert rig.source.skips.count >= 4 and {c.name for c in rig.feed.changes} == {"secrets/db"}


# -- Pub/Sub's checks and outages --------------------------------------------------------------


async def test_a_stopped_pubsub_is_down_and_a_paused_one_comes_back(rig: Rig) -> None:
    rig.start()
    await until(lambda: rig.feed.ups >= 1)
    rig.fake.paused = True
    await until(lambda: rig.feed.downs)
    assert "UNAVAILABLE" in rig.feed.downs[-1] and SUBSCRIPTION in rig.feed.downs[-1]
    rig.fake.paused = False
    ups = rig.feed.ups
    rig.notify("SECRET_VERSION_ADD", secret("db"), "9")
    await until(lambda: rig.feed.ups > ups and rig.feed.changes)
    await rig.server.stop(0)
    downs = len(rig.feed.downs)
    await until(lambda: len(rig.feed.downs) > downs + 1)
    assert all("UNAVAILABLE" in d or "connection" in d for d in rig.feed.downs[downs:])


async def test_a_missing_subscription_is_down_not_found(rig: Rig) -> None:
    rig.source = _source(rig.port, subscription="projects/watch-proj/subscriptions/nope")
    rig.start()
    await until(lambda: rig.feed.downs)
    assert "NOT_FOUND" in rig.feed.downs[0] and not rig.feed.ups


async def test_calls_without_a_token_are_unauthenticated(rig: Rig) -> None:
    rig.source = _source(rig.port, AnonymousCredentials())
    rig.start()
    await until(lambda: rig.feed.downs)
    assert "UNAUTHENTICATED" in rig.feed.downs[0] and set(rig.fake.callers) == {""}


async def test_the_fake_checks_what_pubsub_checks(rig: Rig) -> None:
    """Publish through the real publisher client; Pull's and ModifyAckDeadline's bounds, and a
    nack's redelivery, through the real subscriber client."""
    channel = grpc_helpers_async.create_channel(
        f"127.0.0.1:{rig.port}",
        credentials=Credentials(token=TOKEN),
        ssl_credentials=grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP),
    )
    publisher = PublisherAsyncClient(transport=PublisherGrpcAsyncIOTransport(channel=channel))
    client = SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(channel=channel))
    try:
        answer = await publisher.publish(
            topic=TOPIC, messages=[{"attributes": {"eventType": "SECRET_DELETE"}}]
        )
        assert answer.message_ids and rig.fake.outstanding(SUBSCRIPTION) == 1
        with pytest.raises(exceptions.NotFound):
            await publisher.publish(topic=TOPIC + "x", messages=[{"data": b"x"}], retry=None)
        with pytest.raises(exceptions.InvalidArgument):
            await client.pull(subscription=SUBSCRIPTION, max_messages=0, retry=None)
        pulled = await client.pull(subscription=SUBSCRIPTION, max_messages=5, retry=None)
        (received,) = pulled.received_messages
        assert received.delivery_attempt == 1
        with pytest.raises(exceptions.InvalidArgument):
            await client.modify_ack_deadline(
                subscription=SUBSCRIPTION, ack_ids=[received.ack_id], ack_deadline_seconds=601
            )
        # A nack (deadline 0) delivers it again at once, one attempt later.
        await client.modify_ack_deadline(
            subscription=SUBSCRIPTION, ack_ids=[received.ack_id], ack_deadline_seconds=0
        )
        again = await client.pull(subscription=SUBSCRIPTION, max_messages=5, retry=None)
        assert again.received_messages[0].delivery_attempt == 2
    finally:
        await channel.close()
    with pytest.raises(ValueError):
        rig.fake.add_subscription("projects/p/subscriptions/fast", TOPIC, ack_deadline=5)


async def test_no_credentials_is_down_and_tried_again() -> None:
    async def connect() -> grpc.aio.Channel:
        raise DefaultCredentialsError("File /secret/path was not found.")

    source = SubscriptionSource(
        subscription=SUBSCRIPTION, projects=[PROJECT_ID], connect=connect, backoff=(0.01, 0.01)
    )
    feed = RecordingFeed()
    task = asyncio.create_task(source.run(feed))
    await until(lambda: len(feed.downs) >= 2)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert (
        feed.downs[0]
        == f"subscription {SUBSCRIPTION}: no Google credentials (DefaultCredentialsError)"
    )


def test_create_refuses_a_name_that_is_no_subscription() -> None:
    with pytest.raises(ValueError, match="not a subscription name"):
        changes.create(subscription="projects/p/topics/t", projects=["p"])
    with pytest.raises(ValueError, match="at least one project"):
        changes.create(subscription=SUBSCRIPTION, projects=[])


# -- the dialect's subject meets the source's names -------------------------------------------


@pytest.mark.parametrize(
    ("ref", "event_secret"),
    [
        (GcpRef(f"projects/{PROJECT_ID}/secrets/db/versions/latest"), secret("db")),
        (GcpRef(f"projects/{PROJECT_NUMBER}/secrets/db/versions/3"), secret("db")),
        (
            GcpRef(f"projects/{PROJECT_ID}/locations/us-east1/secrets/api/versions/2", "us-east1"),
            secret("api", location="us-east1"),
        ),
    ],
)
def test_subject_equals_the_name_of_the_matching_event(ref: GcpRef, event_secret: str) -> None:
    change = change_of(
        pubsub.PubsubMessage(
            attributes={"eventType": "SECRET_VERSION_ADD", "secretId": event_secret}
        )
    )
    found = subject(STORE, ref)
    assert change is not None and found is not None
    assert found.name == change.name and not found.prefix
    # The class writes the project's id or number: both are the source's scopes.
    assert found.scope in {PROJECT_ID, PROJECT_NUMBER}


def test_selection_subjects_are_prefixes_of_their_secrets_names() -> None:
    def named(resource: str) -> str:
        message = pubsub.PubsubMessage(
            attributes={"eventType": "SECRET_CREATE", "secretId": resource}
        )
        change = change_of(message)
        assert change is not None
        return change.name

    chosen = GcpSelection(PROJECT_ID, None, "app-", (("team", "pay"),), 100)
    regional = GcpSelection(PROJECT_ID, "us-east1", "", (("team", "pay"),), 100)
    assert subject(STORE, chosen) == Subject(PROJECT_ID, "secrets/app-", prefix=True)
    assert subject(STORE, regional) == Subject(
        PROJECT_ID, "locations/us-east1/secrets/", prefix=True
    )
    assert named(secret("app-db")).startswith("secrets/app-")
    assert named(secret("x", location="us-east1")).startswith("locations/us-east1/secrets/")
    assert not named(secret("x", location="us-east1")).startswith("secrets/")


def test_parameters_are_in_no_feed() -> None:
    ref = GcpRef(
        f"projects/{PROJECT_ID}/locations/global/parameters/app/versions/v1", None, "parameter"
    )
    assert subject(STORE, ref) is None
