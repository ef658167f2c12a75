"""AWS's change source: Secrets Manager and SSM Parameter Store events that an EventBridge rule
delivers to an SQS queue, long-polled by the watcher (provider/core/changes.py,
docs/change-feed.md).

The events, as AWS documents them (`RULE_PATTERNS` is the rule to create):

- Secrets Manager's API calls, through CloudTrail (detail-type `AWS API Call via CloudTrail`,
  detail.eventSource `secretsmanager.amazonaws.com`): each call of `EVENT_NAMES` that
  succeeded names its secret in requestParameters.secretId (a name or an ARN) or, for
  CreateSecret, requestParameters.name. A call that failed (detail.errorCode) changed nothing;
- Secrets Manager's own `Secret Label Updated` (a staging label moved to a new version:
  rotation's end, and every custom label but AWSPENDING/AWSPREVIOUS), named in detail.name;
- Parameter Store's `Parameter Store Change` (detail.operation Create, Update, Delete,
  LabelParameterVersion), named in detail.name.

Each becomes `Change("aws", <event's region>, change_name(...))`, the name the dialect gives a
ref (backends/aws/dialect.py), marked by the event's id. Events of regions outside the source's
`scopes` and events that are not about a secret are deleted quietly; messages that are not such
an event at all are deleted and counted (`QueueSource.skips`), with one log line a minute that
never shows them.

One ReceiveMessage at a time (at most `MAX_BATCH` messages, long-polled for `wait` seconds): its
changes are published, and only then are its messages deleted (DeleteMessageBatch). A batch
whose publish raised stays in the queue, and SQS delivers it again once the visibility timeout
ends (duplicates are harmless). Credentials are the SDK's default chain: the watcher's own
IRSA role or Pod Identity association, which needs sqs:ReceiveMessage and sqs:DeleteMessage on
the queue and nothing of Secrets Manager or SSM.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from backends.aws.dialect import change_name
from backends.aws.errors import translated
from backends.aws.refs import Service
from backends.clouds.aws import sdk_client
from provider.core.changes import (
    POLL_BACKOFF,
    SOURCE_NAME,
    Backoff,
    Change,
    Feed,
    PullCounts,
    Skips,
)
from provider.core.errors import BridgeError, MissingCredential, StoreUnavailable

log = logging.getLogger("secrets_bridge.aws")

STORE = "aws"
#: SQS's most messages per ReceiveMessage (and per DeleteMessageBatch).
MAX_BATCH = 10
#: SQS's largest message; a bigger body (from an emulator) is deleted unread.
MAX_MESSAGE = 256 * 1024
#: Bytes of a name or ARN read from an event (AWS's are about 1,100 at most).
MAX_NAME = 2048
#: SQS's longest long poll.
WAIT_SECONDS = 20
#: Seconds a received batch stays hidden: publishing it takes far less; after a failed publish
#: the batch comes back this much later.
VISIBILITY_SECONDS = 60

#: Secrets Manager calls that change what a read or a listing returns (or who may make it).
EVENT_NAMES = (
    "CreateSecret",
    "PutSecretValue",
    "UpdateSecret",
    "UpdateSecretVersionStage",
    "RotateSecret",
    "CancelRotateSecret",
    "DeleteSecret",
    "RestoreSecret",
    "TagResource",
    "UntagResource",
    "PutResourcePolicy",
    "DeleteResourcePolicy",
    "ReplicateSecretToRegions",
    "RemoveRegionsFromReplication",
    "StopReplicationToReplica",
)
#: SQS's codes for a queue that does not exist (JSON protocol, and query-compatible).
_NO_QUEUE = frozenset({"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"})
CLOUDTRAIL = "AWS API Call via CloudTrail"
LABEL_UPDATED = "Secret Label Updated"
PARAMETER_CHANGE = "Parameter Store Change"
#: The EventBridge rules (one pattern each) whose target is the queue.
RULE_PATTERNS: tuple[Mapping[str, Any], ...] = (
    {
        "source": ["aws.secretsmanager"],
        "detail-type": [CLOUDTRAIL],
        "detail": {"eventSource": ["secretsmanager.amazonaws.com"], "eventName": list(EVENT_NAMES)},
    },
    {"source": ["aws.secretsmanager"], "detail-type": [LABEL_UPDATED]},
    {"source": ["aws.ssm"], "detail-type": [PARAMETER_CHANGE]},
)


class BadEvent(ValueError):
    """A message that is not an EventBridge event (its text is never shown)."""


def change_of(body: str, scopes: frozenset[str]) -> Change | None:
    """The change one message announces; None for an event of no secret of `scopes`."""
    if len(body.encode()) > MAX_MESSAGE:
        raise BadEvent(f"over {MAX_MESSAGE} bytes")
    try:
        event = json.loads(body)
    except (ValueError, RecursionError):
        raise BadEvent("not JSON") from None
    if not isinstance(event, dict) or not isinstance(event.get("detail"), dict):
        raise BadEvent("not an EventBridge event (no detail)")
    region, kind, detail = event.get("region"), event.get("detail-type"), event["detail"]
    if not isinstance(region, str) or not isinstance(kind, str):
        raise BadEvent("not an EventBridge event (no region or detail-type)")
    found = _named(event.get("source"), kind, detail)
    if found is None or region not in scopes:
        return None
    service, name = found
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise BadEvent(f"a {kind} event without a name")
    marker = event.get("id")  # EventBridge's event id: the log's handle on it
    marker = marker if isinstance(marker, str) else ""
    return Change.of(STORE, region, change_name(service, name), marker)


def _named(source: object, kind: str, detail: dict[str, Any]) -> tuple[Service, object] | None:
    """(service, the name or ARN the event gives) for an event about a secret or parameter."""
    if source == "aws.ssm" and kind == PARAMETER_CHANGE:
        return "ssm", detail.get("name")
    if source != "aws.secretsmanager":
        return None
    if kind == LABEL_UPDATED:
        return "secretsmanager", detail.get("name")
    if (
        kind != CLOUDTRAIL
        or detail.get("eventSource") != "secretsmanager.amazonaws.com"
        or detail.get("eventName") not in EVENT_NAMES
        or detail.get("errorCode")
    ):
        return None
    request = detail.get("requestParameters")
    if not isinstance(request, dict):
        raise BadEvent("a CloudTrail event without requestParameters")
    return "secretsmanager", request.get("secretId") or request.get("name")


@dataclass
class Counts(PullCounts):
    #: Events of no secret, or of another region (deleted quietly).
    ignored: int = 0


class QueueSource:
    """The `Source` of one SQS queue of EventBridge events; `connect()` opens its SQS client."""

    store = STORE
    pulled = True

    def __init__(
        self,
        *,
        queue_url: str,
        scopes: Iterable[str],
        connect: Callable[[], AbstractAsyncContextManager[Any]],
        name: str,
        wait: int = WAIT_SECONDS,
        visibility: int = VISIBILITY_SECONDS,
        backoff: tuple[float, float] = POLL_BACKOFF,
    ) -> None:
        if not SOURCE_NAME.match(name):
            raise ValueError(f"source name {name[:60]!r} is not a DNS label")
        if not 0 <= wait <= WAIT_SECONDS:
            raise ValueError(f"wait: {wait} is not 0..{WAIT_SECONDS} seconds (SQS's long poll)")
        self.name = name
        self.scopes = frozenset(scopes)
        if not self.scopes:
            raise ValueError("a queue source covers at least one region")
        self.queue_url = queue_url
        self.counts = Counts()
        self._connect = connect
        self._wait = wait
        self._visibility = visibility
        self._backoff = backoff
        self._exits = contextlib.AsyncExitStack()
        self._client: Any = None
        #: Messages that are not events at all (deleted, logged once a minute).
        self.skips = Skips(
            log,
            f"aws {name}",
            "deleted",
            "messages that are not EventBridge events of Secrets Manager or SSM",
        )

    async def run(self, feed: Feed) -> None:
        backoff = Backoff(*self._backoff)
        while True:
            try:
                await self._receive_once(feed)
            except BridgeError as exc:
                feed.down(_reason(exc, self.queue_url))
                await backoff.wait()
            else:
                backoff.reset()

    async def close(self) -> None:
        self._client = None
        await self._exits.aclose()

    async def _receive_once(self, feed: Feed) -> None:
        """One ReceiveMessage, its publish and its deletes; raises BridgeError if SQS failed."""
        self.counts.receives += 1
        with _sqs_call(f"SQS ReceiveMessage on {self.queue_url}"):
            if self._client is None:
                self._client = await self._exits.enter_async_context(self._connect())
            sqs = self._client
            answer = await sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=MAX_BATCH,
                WaitTimeSeconds=self._wait,
                VisibilityTimeout=self._visibility,
            )
        feed.up()
        messages = answer.get("Messages") or []
        await self._handle(sqs, feed, messages[:MAX_BATCH])

    async def _handle(self, sqs: Any, feed: Feed, messages: Sequence[Any]) -> None:
        """Publish a batch's changes, then delete it (only what yields no change when the
        publish raised: the rest is delivered again)."""
        changes: dict[tuple[str, str], Change] = {}
        announcing, spare = [], []
        for message in messages:
            self.counts.messages += 1
            body = message.get("Body")
            try:
                if not isinstance(body, str):
                    raise BadEvent("no body")
                change = change_of(body, self.scopes)
                self.counts.ignored += change is None
            except BadEvent as bad:
                self.skips.add(str(bad))
                change = None
            handle = message.get("ReceiptHandle")
            if not isinstance(handle, str):
                continue  # nothing to delete it by: SQS's own answer is malformed
            if change is None:
                spare.append(handle)
                continue
            announcing.append(handle)
            changes[change.scope, change.name] = change  # repeats of one secret: one record
        if not await self.counts.published(feed, changes.values(), log, f"aws {self.name}"):
            announcing = []  # SQS delivers them again after the visibility timeout
        await self._delete(sqs, [*announcing, *spare])

    async def _delete(self, sqs: Any, handles: Sequence[str]) -> None:
        if not handles:
            return
        entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
        with _sqs_call(f"SQS DeleteMessageBatch on {self.queue_url}"):
            answer = await sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
        failed = answer.get("Failed") or []
        self.counts.acknowledged += len(handles) - len(failed)
        if failed:  # delivered again after the visibility timeout: a duplicate, harmless
            log.info("aws %s: %d of %d deletes failed", self.name, len(failed), len(handles))


@contextlib.contextmanager
def _sqs_call(what: str) -> Iterator[None]:
    """One SQS call, its failure a BridgeError (backends/aws/errors.py) that says what to fix."""
    from botocore.exceptions import ClientError

    with translated(what, "; allow the watcher sqs:ReceiveMessage and sqs:DeleteMessage on it"):
        try:
            yield
        except ClientError as exc:
            if (exc.response.get("Error") or {}).get("Code") in _NO_QUEUE:
                raise StoreUnavailable(f"{what}: the queue does not exist") from None
            raise


def _reason(exc: BridgeError, queue_url: str) -> str:
    """The health document's line: the error (it never carries AWS's text), or, without
    credentials, where the watcher gets them (the store's message speaks of pods)."""
    if isinstance(exc, MissingCredential):
        return (
            f"SQS ReceiveMessage on {queue_url}: the watcher has no AWS credentials (give its "
            "ServiceAccount an IRSA role or a Pod Identity association)"
        )
    return str(exc)


def create(
    *,
    queue_url: str,
    region: str,
    regions: Sequence[str] = (),
    name: str = "",
    endpoint: str | None = None,
    wait: int = WAIT_SECONDS,
    visibility: int = VISIBILITY_SECONDS,
    backoff: tuple[float, float] = POLL_BACKOFF,
) -> QueueSource:
    """The watcher's AWS source. `queue_url`: the SQS queue the EventBridge rules target, in
    `region`; `regions`: the regions whose events reach it (the source's scopes; default
    `region` alone: another region's rule may forward its events there too); `name`: default
    `aws-<region>`; `endpoint`: SQS's URL (default botocore's, which honours
    AWS_ENDPOINT_URL_SQS); `wait`: seconds of each long poll (0..20); `visibility`: seconds a
    received batch stays hidden; `backoff`: the first and the longest wait after a failure.
    Credentials: the SDK's default chain."""

    def connect() -> AbstractAsyncContextManager[Any]:
        from aiobotocore.session import get_session

        client: AbstractAsyncContextManager[Any] = sdk_client(
            get_session(),
            "sqs",
            region,
            endpoint=endpoint,
            connect_timeout=10.0,
            read_timeout=wait + 10.0,  # a long poll answers after `wait` seconds
        )
        return client

    return QueueSource(
        queue_url=queue_url,
        scopes=regions or (region,),
        connect=connect,
        name=name or f"aws-{region}",
        wait=wait,
        visibility=visibility,
        backoff=backoff,
    )
