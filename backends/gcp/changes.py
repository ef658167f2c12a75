"""Google Secret Manager's change source: the Pub/Sub notifications of its secrets, pulled from
a subscription (provider/core/changes.py, docs/change-feed.md).

A secret configured with `topics` makes Secret Manager publish a message at each change; its
attributes say what changed: `eventType` (SECRET_CREATE, SECRET_UPDATE, SECRET_DELETE,
SECRET_ROTATE, SECRET_VERSION_ADD, SECRET_VERSION_ENABLE, SECRET_VERSION_DISABLE,
SECRET_VERSION_DESTROY, SECRET_VERSION_DESTROY_SCHEDULED), `secretId` (the secret,
`projects/<number>/secrets/<id>` or `projects/<number>/locations/<l>/secrets/<id>`) and, for a
version's event, `versionId`. Each message whose `secretId` parses becomes
`Change("gcp", <project>, secret_subject(secretId))`, whatever its event type (a type added
later still names a changed secret); TOPIC_CONFIGURED, the test message sent when a topic is
set, is acknowledged quietly. The data (the resource's JSON) is never read.

One unary Pull at a time, rather than StreamingPull: each answer is one bounded batch
(`MAX_BATCH` messages, `MAX_RECEIVE` bytes) that is published and then acknowledged, with no
lease management in the background, and each answer is a proof that Pub/Sub answers (`up`).
Events are few, so the throughput StreamingPull adds is not needed. A Pull with nothing to
deliver is held by Pub/Sub until its deadline: DEADLINE_EXCEEDED on a channel still connected
(gRPC's keepalive pings it every 30 s, as the library's own channels do) is an idle answer.

Acknowledge follows `feed.publish` only once it returned: a batch whose publish raised is left
to its lease, and Pub/Sub delivers it again after the subscription's ack deadline (give the
subscription 60 s: a publish slower than the deadline is acknowledged too late, delivered twice,
which is harmless). Messages that do not parse are acknowledged at once and counted, with one
log line a minute that never shows them.

Credentials are the watcher's own (google-auth's default: its workload identity), which needs
`roles/pubsub.subscriber` on the subscription and nothing of Secret Manager.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence

import google.auth
import google.auth.exceptions
import grpc
from google.api_core import exceptions, grpc_helpers_async
from google.auth.credentials import Credentials
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport
from google.pubsub_v1.types import pubsub

from backends.gcp.client import proxy_options
from backends.gcp.dialect import secret_subject
from backends.proxies import Proxies
from provider.core.changes import POLL_BACKOFF, Backoff, Change, Feed, PullCounts, Skips

log = logging.getLogger("secrets_bridge.gcp")
# The generated client logs requests and responses whenever its logger allows DEBUG.
logging.getLogger("google.pubsub_v1").setLevel(logging.WARNING)

STORE = "gcp"
PUBSUB_ENDPOINT = "pubsub.googleapis.com:443"
PUBSUB_SCOPE = "https://www.googleapis.com/auth/pubsub"
#: Messages asked for per Pull (Pub/Sub's own bound is 1,000).
MAX_BATCH = 100
#: Bytes of one Pull's answer: over Pub/Sub's 10 MB message limit, so that a batch of one always
#: fits and a huge message is acknowledged as unparseable rather than refused forever.
MAX_RECEIVE = 12 * 1024 * 1024
#: Bytes of one notification: a Secret's JSON (labels, annotations, topics) is far smaller.
MAX_MESSAGE = 256 * 1024
#: Pub/Sub's bounds of a message's attributes: how many, and a value's length.
MAX_ATTRIBUTES = 100
MAX_ATTRIBUTE = 1024
#: Seconds a Pull may be held (Pub/Sub holds one with nothing to deliver until its deadline).
PULL_TIMEOUT = 25.0
#: Seconds of an Acknowledge.
ACK_TIMEOUT = 10.0
QUIET = frozenset({"TOPIC_CONFIGURED"})
_EVENT = re.compile(r"[A-Z][A-Z_]{0,63}")
_SUBSCRIPTION = re.compile(r"projects/[\w.:-]{1,100}/subscriptions/[A-Za-z][\w.~+%-]{2,254}")
#: What a refusal means to the watcher's operator (the reason is shown, never Google's text).
_REASONS = {
    grpc.StatusCode.NOT_FOUND: "the subscription does not exist",
    grpc.StatusCode.PERMISSION_DENIED: "the watcher may not pull it (roles/pubsub.subscriber)",
    grpc.StatusCode.UNAUTHENTICATED: "the watcher's credentials were refused",
    grpc.StatusCode.UNAVAILABLE: "Pub/Sub did not answer",
    grpc.StatusCode.DEADLINE_EXCEEDED: "Pub/Sub did not answer and the connection is down",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "over the quota or the answer's size: pulling fewer",
}


class BadNotification(ValueError):
    """A message that is not a Secret Manager notification (its text is never shown)."""


def change_of(message: pubsub.PubsubMessage) -> Change | None:
    """The change a notification announces; None for the topic's test message."""
    if pubsub.PubsubMessage.pb(message).ByteSize() > MAX_MESSAGE:
        raise BadNotification(f"over {MAX_MESSAGE} bytes")
    attributes = message.attributes
    if len(attributes) > MAX_ATTRIBUTES:
        raise BadNotification(f"over {MAX_ATTRIBUTES} attributes")
    event = attributes.get("eventType", "")
    if event in QUIET:
        return None
    if not _EVENT.fullmatch(event):
        raise BadNotification("no eventType")
    resource = attributes.get("secretId", "")
    found = secret_subject(resource) if len(resource) <= MAX_ATTRIBUTE else None
    if found is None:
        raise BadNotification("no secretId naming a secret")
    version = attributes.get("versionId", "")[:MAX_ATTRIBUTE].rpartition("/versions/")[2]
    project, name = found
    return Change.of(STORE, project, name, f"{event} {version}".strip())


class SubscriptionSource:
    """The `Source` of one Pub/Sub subscription of Secret Manager notifications."""

    store = STORE
    pulled = True

    def __init__(
        self,
        *,
        subscription: str,
        projects: Iterable[str],
        connect: Callable[[], Awaitable[grpc.aio.Channel]],
        name: str = "gcp",
        batch: int = MAX_BATCH,
        timeout: float = PULL_TIMEOUT,
        backoff: tuple[float, float] = POLL_BACKOFF,
    ) -> None:
        if not _SUBSCRIPTION.fullmatch(subscription):
            raise ValueError(
                f"{subscription[:300]!r} is not a subscription name "
                "(projects/<project>/subscriptions/<subscription>)"
            )
        self.name = name
        #: The projects its notifications cover, by id and by number (notifications name the
        #: number, classes usually the id); names leave the project out (`secret_subject`).
        self.scopes = frozenset(projects)
        if not self.scopes:
            raise ValueError("a subscription source covers at least one project")
        self.subscription = subscription
        self.counts = PullCounts()
        self._connect = connect
        self._batch = self._size = batch
        self._timeout = timeout
        self._backoff = backoff
        self._channel: grpc.aio.Channel | None = None
        #: Messages acknowledged unread, logged once a minute.
        self.skips = Skips(
            log, f"gcp {name}", "acknowledged", "messages that are not Secret Manager notifications"
        )

    async def run(self, feed: Feed) -> None:
        client = None
        backoff = Backoff(*self._backoff)
        while True:
            if client is None:
                client, problem = await self._client()
            if client is not None:
                problem = await self._pull_once(client, feed)
            if problem is None:
                backoff.reset()
                continue
            feed.down(f"subscription {self.subscription}: {problem}")
            await backoff.wait()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _client(self) -> tuple[SubscriberAsyncClient | None, str | None]:
        """The client on a new channel, or why there is none (no credentials found)."""
        try:
            self._channel = await self._connect()
        except google.auth.exceptions.GoogleAuthError as exc:
            return None, f"no Google credentials ({type(exc).__name__})"
        transport = SubscriberGrpcAsyncIOTransport(channel=self._channel)
        return SubscriberAsyncClient(transport=transport), None

    async def _pull_once(self, client: SubscriberAsyncClient, feed: Feed) -> str | None:
        """One Pull and what follows it; the reason it failed, or None."""
        self.counts.receives += 1
        asked = self._size
        try:
            response = await client.pull(
                request={"subscription": self.subscription, "max_messages": asked},
                retry=None,
                timeout=self._timeout,
            )
        except exceptions.DeadlineExceeded:
            if self._connected():
                feed.up()  # held with nothing to deliver
                return None
            return _reason(grpc.StatusCode.DEADLINE_EXCEEDED)
        except exceptions.GoogleAPICallError as exc:
            if exc.grpc_status_code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._size = max(1, self._size // 2)
            return _reason(exc.grpc_status_code)
        feed.up()
        self._size = min(self._batch, asked * 2)
        # Pub/Sub answers at most what was asked; a list first, since a slice of the repeated
        # field would be raw protobuf messages.
        return await self._handle(client, feed, list(response.received_messages)[:asked])

    def _connected(self) -> bool:
        channel = self._channel
        return channel is not None and (
            channel.get_state(try_to_connect=False) is grpc.ChannelConnectivity.READY
        )

    async def _handle(
        self, client: SubscriberAsyncClient, feed: Feed, received: Sequence[pubsub.ReceivedMessage]
    ) -> str | None:
        """Publish a batch's changes, then acknowledge it (only what yields no change when the
        publish raised: the rest is delivered again)."""
        changes: dict[str, Change] = {}
        announcing, spare = [], []
        for item in received:
            self.counts.messages += 1
            try:
                change = change_of(item.message)
            except BadNotification as bad:
                self.skips.add(str(bad))
                change = None
            if change is None:
                spare.append(item.ack_id)
                continue
            announcing.append(item.ack_id)
            changes[change.name] = change  # duplicates and repeats of one secret: one record
        if not await self.counts.published(feed, changes.values(), log, f"gcp {self.name}"):
            announcing = []  # their lease runs out, and Pub/Sub delivers them again
        ack_ids = [*announcing, *spare]
        if not ack_ids:
            return None
        try:
            await client.acknowledge(
                request={"subscription": self.subscription, "ack_ids": ack_ids},
                retry=None,
                timeout=ACK_TIMEOUT,
            )
        except exceptions.GoogleAPICallError as exc:
            return f"acknowledging: {_reason(exc.grpc_status_code)} (the batch is delivered again)"
        self.counts.acknowledged += len(ack_ids)
        return None


def _reason(code: grpc.StatusCode | None) -> str:
    """The status and what it means; Google's own text stays out of the health document."""
    if code is None:
        return "refused"
    return f"{code.name}: {_REASONS.get(code, 'refused')}"


def create(
    *,
    subscription: str,
    projects: Sequence[str],
    name: str = "gcp",
    endpoint: str = PUBSUB_ENDPOINT,
    ca_file: str = "",
    local_channel: bool = False,
    credentials: Credentials | None = None,
    batch: int = MAX_BATCH,
    pull_timeout: float = PULL_TIMEOUT,
    backoff: tuple[float, float] = POLL_BACKOFF,
) -> SubscriptionSource:
    """The watcher's Google source. `subscription`: `projects/<p>/subscriptions/<s>` of the
    topic the secrets notify; `projects`: the ids and numbers of the projects whose secrets
    notify it (the source's scopes); `endpoint`: Pub/Sub's host:port, trusting `ca_file` (PEM;
    default the system's roots); `local_channel` (tests only): gRPC local credentials instead of
    TLS; `credentials`: default google-auth's (the watcher's workload identity); `batch`:
    messages per Pull; `pull_timeout`: seconds a Pull may be held; `backoff`: the first and the
    longest wait after a failed Pull."""

    async def connect() -> grpc.aio.Channel:
        creds = credentials
        if creds is None:
            creds, _ = await asyncio.to_thread(google.auth.default, scopes=[PUBSUB_SCOPE])
        if local_channel:
            channel_creds = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
        else:
            roots = await asyncio.to_thread(_read, ca_file) if ca_file else None
            channel_creds = grpc.ssl_channel_credentials(root_certificates=roots)
        channel: grpc.aio.Channel = grpc_helpers_async.create_channel(
            endpoint,
            credentials=creds,
            scopes=[PUBSUB_SCOPE],
            ssl_credentials=channel_creds,
            options=[
                ("grpc.max_receive_message_length", MAX_RECEIVE),
                ("grpc.enable_retries", 0),
                ("grpc.keepalive_time_ms", 30_000),
                *proxy_options(Proxies.from_env(), endpoint),
            ],
        )
        return channel

    return SubscriptionSource(
        subscription=subscription,
        projects=projects,
        connect=connect,
        name=name,
        batch=batch,
        timeout=pull_timeout,
        backoff=backoff,
    )


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()
